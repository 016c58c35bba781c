"""Which rows of an index a metadata filter lets through, without a pass in Python over every
chunk per filter, and kept under one memory budget per worker.

Per index version and field, a column of codes is built once, in one pass: for each chunk the
rank of its value among the field's distinct values, sorted (-1: it has none). A filter is then
array operations on the columns it names: a value or a list of values compares codes, and a
prefix is a range of codes, since sorted values that share a prefix are contiguous. The fields
an index has are read once too, so a filter on a field no chunk has costs no column.

Columns and filter results share one cache, least recently used out first and bounded in bytes
(``RAGLINE_FILTER_CACHE_BYTES``) across every index a worker holds: neither many distinct
filters nor many fields grow a worker past it. Something larger than the whole budget is
computed for its search and not kept.
"""

from __future__ import annotations

import sys
import threading
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from ragline.broker.contract.messages import MetadataFilter, PrefixMatch, filter_key
from ragline.workers.retrieval.chunking import Chunk
from ragline.workers.retrieval.search import field_value

DEFAULT_FILTER_CACHE_BYTES = 64 * 1024 * 1024
# What an entry costs beyond its arrays: the key, the cache's own bookkeeping.
_ENTRY_OVERHEAD = 256

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Column:
    """One field of one index version: ``codes[row]`` is the rank of the row's value in
    ``values`` (sorted, distinct), or -1."""

    codes: np.ndarray
    values: list[str]

    @property
    def nbytes(self) -> int:
        # The strings are the chunks' own (not copied); the list holds one pointer each.
        return int(self.codes.nbytes) + 8 * len(self.values)

    def mask(self, wanted: str | list[str] | PrefixMatch) -> np.ndarray:
        if isinstance(wanted, PrefixMatch):
            n = len(wanted.prefix)
            # Truncated to the prefix's length, sorted values stay sorted.
            lo = bisect_left(self.values, wanted.prefix, key=lambda v: v[:n])
            hi = bisect_right(self.values, wanted.prefix, key=lambda v: v[:n])
            return (self.codes >= lo) & (self.codes < hi)
        asked = [wanted] if isinstance(wanted, str) else wanted
        codes = [c for c in map(self._code, asked) if c >= 0]
        if len(codes) == 1:
            return self.codes == codes[0]
        return np.isin(self.codes, codes)

    def _code(self, value: str) -> int:
        i = bisect_left(self.values, value)
        return i if i < len(self.values) and self.values[i] == value else -1


def build_column(chunks: Sequence[Chunk], field: str) -> Column:
    raw = [field_value(c, field) for c in chunks]
    values = sorted({v for v in raw if v is not None})
    rank = {v: i for i, v in enumerate(values)}
    codes = np.fromiter((-1 if v is None else rank[v] for v in raw), dtype=np.int32, count=len(raw))
    return Column(codes, values)


def index_fields(chunks: Sequence[Chunk]) -> frozenset[str]:
    """Every field a filter can match in these chunks: ``title`` and each metadata key."""
    found: set[str] = {"title"}
    for chunk in chunks:
        found.update(chunk.meta)
    return frozenset(found)


class FilterCache:
    """Columns and filter results of every index a worker holds, least recently used out first,
    at most ``max_bytes`` in all. Thread-safe (a shard search and a batch may share it)."""

    def __init__(self, max_bytes: int = DEFAULT_FILTER_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[tuple[str, str, str], tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: tuple[str, str, str], build: Callable[[], T], size: Callable[[T], int]) -> T:
        """The entry under ``key`` (index, version, what), built and kept if it fits."""
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                value: T = found[0]
                return value
        # Built outside the lock: another thread may build the same entry meanwhile; the later
        # one replaces it, and the budget counts only what is kept.
        value = build()
        cost = size(value) + _ENTRY_OVERHEAD
        if cost > self.max_bytes:
            return value
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            while self._entries and self.bytes + cost > self.max_bytes:
                _, (_, freed) = self._entries.popitem(last=False)
                self.bytes -= freed
            self._entries[key] = (value, cost)
            self.bytes += cost
        return value

    def forget(self, index: str, *, keep: str | None = None) -> None:
        """Drop what is kept for ``index``'s versions but ``keep`` (a swapped-out or deleted one)."""
        with self._lock:
            for key in [k for k in self._entries if k[0] == index and k[1] != keep]:
                self.bytes -= self._entries.pop(key)[1]


def filter_rows(
    cache: FilterCache, index: str, version: str, chunks: Sequence[Chunk], flt: MetadataFilter
) -> np.ndarray:
    """The rows (int64, ascending) of ``chunks`` that ``flt`` lets through: every key must match."""

    def compute() -> np.ndarray:
        fields = cache.get((index, version, "fields"), lambda: index_fields(chunks), _set_size)
        if any(key not in fields for key in flt):
            return np.empty(0, dtype=np.int64)
        mask = np.ones(len(chunks), dtype=bool)
        for key, wanted in sorted(flt.items()):
            column = cache.get((index, version, f"column:{key}"), _column_of(chunks, key), _column_size)
            mask &= column.mask(wanted)
        return np.flatnonzero(mask).astype(np.int64)

    return cache.get((index, version, f"rows:{filter_key(flt)}"), compute, _array_size)


def _column_of(chunks: Sequence[Chunk], key: str) -> Callable[[], Column]:
    return lambda: build_column(chunks, key)


def _set_size(fields: frozenset[str]) -> int:
    return sys.getsizeof(fields) + sum(sys.getsizeof(f) for f in fields)


def _column_size(column: Column) -> int:
    return column.nbytes


def _array_size(rows: np.ndarray) -> int:
    return int(rows.nbytes)
