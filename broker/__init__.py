"""The contract between the API and the workers: settings, queues, keys, events.

Imports neither ``api`` nor ``workers``.
"""
