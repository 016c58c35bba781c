"""Generation on one GPU, offline, in one command: ``python -m bench.gpu`` (see run.py)."""
