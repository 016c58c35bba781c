"""Generation workers: one vLLM engine per process, fed by many concurrent Celery tasks."""
