"""Celery workers: CPU retrieval and accelerator generation, each on its own queue."""
