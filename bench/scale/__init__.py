"""Retrieval at scale (1M-10M vectors, shards): ``python -m bench.scale`` (see run.py)."""
