"""The indexes a worker has loaded, one version each, kept in step with the registry in Redis:
a re-ingest (a new version registered) is picked up live, a deleted index is let go.

A worker's batches never load an index themselves (``background=True``): a version they find
registered but not loaded is loaded beside the one being served, in a thread, and swapped in by
one assignment when it is whole; meanwhile the version loaded before goes on answering (a batch
that holds it finishes with it). A request that names the new version (what the API saw
registered) waits for it outside the batch: the batch hands it to the load (:class:`Loading`),
which sends it back to the queue once the version is in. Loads run one at a time, each on the
cores it can get. Tools and tests load in the caller's thread (``background=False``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis
from ragline.broker.contract.records import IndexInfo
from ragline.broker.redis.keys import Keys
from ragline.broker.state import indexes, shards
from ragline.workers.errors import WorkerError
from ragline.workers.retrieval.filter_rows import FilterCache
from ragline.workers.retrieval.index_files import load
from ragline.workers.retrieval.loaded_index import LoadedIndex

log = logging.getLogger(__name__)

# A version that failed to load is tried again after this long (its files may be back), not at
# every batch that names it.
RETRY_FAILED_LOAD_S = 10.0


class UnknownIndex(WorkerError, LookupError):
    pass


class IndexLoadFailed(WorkerError, RuntimeError):
    """The index is registered but its version could not be loaded (the worker's log says why;
    the message names no file)."""


class Loading:
    """One version being loaded in a thread; whoever waits for it is called back once it is
    swapped in, or once it failed (``failed``)."""

    def __init__(self, info: IndexInfo) -> None:
        self.info = info
        self.failed = False
        self.finished_at = 0.0
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    @property
    def version(self) -> str:
        return self.info.version

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_s: float | None = None) -> bool:
        return self._done.wait(timeout_s)

    def when_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the load has ended (at once when it has): on the loading
        thread, so it must not block."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def finish(self, *, failed: bool) -> None:
        with self._lock:
            self.failed = failed
            self.finished_at = time.monotonic()
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # one waiter's failure must not keep the others waiting
                log.exception("a caller waiting for index %s version %s failed", self.info.name, self.version)


@dataclass(frozen=True, slots=True)
class Serving:
    """What answers for an index now: ``loaded`` (None: no version yet), and the newer version
    being loaded beside it, if any."""

    loaded: LoadedIndex | None
    loading: Loading | None = None

    def must_wait(self, version: str | None) -> bool:
        """Whether a request that named ``version`` (None: whatever is current) waits for the
        load: nothing is loaded yet, or it named the version being loaded. A failed load keeps
        nobody waiting; with nothing loaded, its requests fail."""
        if self.loading is None or self.loading.failed:
            return False
        return self.loaded is None or (version is not None and version != self.loaded.info.version)


class IndexCache:
    """The worker's loaded indexes; follows the registry so a re-ingest is picked up live."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        *,
        ef_search: int,
        recheck_s: float = 0.5,
        background: bool = False,
        load_version: Callable[[IndexInfo], LoadedIndex] | None = None,
        filter_cache: FilterCache | None = None,
    ) -> None:
        self._client = client
        self._keys = keys
        self._recheck_s = recheck_s
        self._background = background
        self._load: Callable[[IndexInfo], LoadedIndex] = load_version or (
            lambda info: load(info, ef_search=ef_search)
        )
        # Every loaded index's filter results, under one memory budget.
        self.filter_cache = filter_cache or FilterCache()
        self._loaded: dict[str, LoadedIndex] = {}
        self._checked_at: dict[str, float] = {}
        self._loading: dict[str, Loading] = {}
        self._lock = threading.Lock()
        self._one_load_at_a_time = threading.Lock()

    def get(self, name: str, *, version: str | None = None) -> LoadedIndex:
        """The current version of ``name``, loaded first if need be, waiting for it (a worker's
        start, tools); ``version`` (what the API saw) forces a recheck if unseen."""
        serving = self.serving(name, version=version)
        if serving.loading is not None and not serving.loading.done():
            serving.loading.wait()
        loaded = self._loaded.get(name)
        if loaded is None:
            raise IndexLoadFailed(f"index {name!r} could not be loaded")
        return loaded

    def serving(self, name: str, *, version: str | None = None) -> Serving:
        """What answers for ``name`` now, never waiting for a load: the version loaded, and the
        registered one being loaded beside it when they differ. ``version`` (what the API saw)
        forces a registry check when it is not the loaded one; else it is checked at most every
        ``recheck_s``. UnknownIndex for an index not (or no longer) registered."""
        now = time.monotonic()
        loaded = self._loaded.get(name)
        fresh = now - self._checked_at.get(name, 0.0) < self._recheck_s
        if loaded is not None and (loaded.info.version == version or (version is None and fresh)):
            return Serving(loaded)
        pending = self._loading.get(name)
        if pending is not None and not pending.done() and (version == pending.version or fresh):
            return Serving(loaded, pending)  # known already: no registry read per batch meanwhile
        info = indexes.lookup(self._client, self._keys, name)
        if info is None or info.index_type == shards.SHARDED_TYPE:
            # Deleted (DELETE /v1/indexes/{name}): its memory goes with it. A sharded index has no
            # files of its own to load (its shards do; this is one whose shard map is gone).
            self._forget(name)
            raise UnknownIndex(name)
        self._checked_at[name] = now
        if loaded is not None and loaded.info.version == info.version:
            return Serving(loaded)
        if not self._background:
            return Serving(self._load_now(info))
        return Serving(loaded, self._load_aside(info))

    def _forget(self, name: str) -> None:
        with self._lock:
            self._loaded.pop(name, None)
        self.filter_cache.forget(name)

    def _load_now(self, info: IndexInfo) -> LoadedIndex:
        with self._lock:  # one thread loads; the others wait for it
            loaded = self._loaded.get(info.name)
            if loaded is None or loaded.info.version != info.version:
                loaded = self._install(self._load(info))
            return loaded

    def _install(self, loaded: LoadedIndex) -> LoadedIndex:
        """The swap: one assignment, so a reader gets the old version or the new one, whole."""
        loaded.filter_cache = self.filter_cache
        self._loaded[loaded.info.name] = loaded
        self.filter_cache.forget(loaded.info.name, keep=loaded.info.version)
        return loaded

    def _load_aside(self, info: IndexInfo) -> Loading:
        with self._lock:
            pending = self._loading.get(info.name)
            if pending is not None:
                if not pending.done():
                    # Another version is on its way: it is installed first, and the next check
                    # after it starts this one (versions are installed in the order registered).
                    return pending
                recent = time.monotonic() - pending.finished_at < RETRY_FAILED_LOAD_S
                if pending.failed and pending.version == info.version and recent:
                    return pending
            loading = self._loading[info.name] = Loading(info)
        threading.Thread(
            target=self._load_in_thread, args=(loading,), name=f"load-{info.name}", daemon=True
        ).start()
        return loading

    def _load_in_thread(self, loading: Loading) -> None:
        info = loading.info
        started = time.perf_counter()
        try:
            with self._one_load_at_a_time:
                loaded = self._load(info)
        except Exception:
            log.exception("index %s version %s could not be loaded", info.name, info.version)
            loading.finish(failed=True)
            return
        with self._lock:
            self._install(loaded)
            self._checked_at[info.name] = time.monotonic()
        log.info(
            "index %s version %s loaded in %.2f s, now serving",
            info.name,
            info.version,
            time.perf_counter() - started,
        )
        loading.finish(failed=False)
