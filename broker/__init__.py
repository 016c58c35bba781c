"""The contract between the API and the workers: typed payloads and events (contract.py), settings,
queues, keys, event streams.

Imports neither ``api`` nor ``workers``.
"""
