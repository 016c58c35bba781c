"""Fault injection against a running stack: ``python -m bench.faults`` (see run.py)."""
