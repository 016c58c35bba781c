"""Benchmarks: each prints side-by-side ratios measured in one run on this machine."""
