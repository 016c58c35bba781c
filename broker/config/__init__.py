"""Configuration: the one ``Settings`` (``RAGLINE_`` variables), the host's defaults, the secret policy."""
