"""An index's documents over HTTP: upload, list, delete; each write a job on the ingest queue."""
