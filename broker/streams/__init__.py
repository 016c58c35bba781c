"""Per-request event streams: the reader and writer, the batched token writer, cancel flags."""
