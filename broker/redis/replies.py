"""Redis replies as ragline reads them.

Its clients never decode replies (``decode_responses`` is off), so a string reply is bytes;
redis-py types every reply ``bytes | str``, not knowing how the client was built.
"""

from __future__ import annotations


def text(raw: bytes | str) -> str:
    """A string reply (a value, a member, a field) as text."""
    return raw.decode() if isinstance(raw, bytes) else raw
