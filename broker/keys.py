"""Redis key names, in one place so the API, the workers and operators agree on them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str = "ragline"

    def events(self, request_id: str) -> str:
        """The per-request event stream (sources, token, done, error)."""
        return f"{self.prefix}:ev:{request_id}"

    @property
    def indexes(self) -> str:
        """Hash: index name -> JSON {version, path, chunks, dim}."""
        return f"{self.prefix}:indexes"

    def workers(self, queue: str) -> str:
        """Sorted set: live worker id -> last heartbeat (unix seconds)."""
        return f"{self.prefix}:workers:{queue}"
