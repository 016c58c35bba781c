"""Retrieval worker: reading documents into sections and chunking them."""
