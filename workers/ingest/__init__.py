"""The ingest worker: documents uploaded over HTTP become new index versions."""
