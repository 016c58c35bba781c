"""ragline.client against the real stack: typed answers, streams that resume over dropped
connections (cut by a real TCP proxy) with no gap and no repeat, jobs, and the errors."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from ragline.broker.config.settings import Settings
from ragline.broker.redis.keys import Keys
from ragline.broker.state import apikeys

from ragline.client import (
    AsyncClient,
    BadRequest,
    CancelledEvent,
    Client,
    Conflict,
    DoneEvent,
    InvalidRequest,
    JobTimeout,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    SourcesEvent,
    StreamEvent,
    StreamInterrupted,
    TokenEvent,
    Unauthorized,
    Unavailable,
)
from tests.helpers import Api, api_without_redis

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


class CuttingProxy:
    """A TCP proxy in front of the API that cuts its first ``cuts`` connections in the middle of
    an answer: once the response has carried ``marker`` ``after`` times it forwards a few bytes
    more (half an event) and closes both sides. Later connections pass untouched."""

    def __init__(self, upstream: str, *, cuts: int, marker: bytes = b"event: token", after: int = 3) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self._upstream = (host, int(port))
        self._marker, self._after = marker, after
        self._cuts_left = cuts
        self.cut = 0
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.base = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            cut = self._cuts_left > 0
            self._cuts_left -= cut
            threading.Thread(target=self._serve, args=(client, cut), daemon=True).start()

    def _serve(self, client: socket.socket, cut: bool) -> None:
        upstream = socket.create_connection(self._upstream)
        threading.Thread(target=_pump, args=(client, upstream), daemon=True).start()
        seen, sent = b"", 0
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                if not cut:
                    client.sendall(data)
                    continue
                seen += data
                at = -1
                for _ in range(self._after):
                    at = seen.find(self._marker, at + 1)
                    if at < 0:
                        break
                if at < 0:
                    client.sendall(seen[sent:])
                    sent = len(seen)
                    continue
                client.sendall(seen[sent : at + len(self._marker) + 5])
                self.cut += 1
                break
        for sock in (client, upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)


@pytest.fixture
def proxy(api: Api) -> Iterator[CuttingProxy]:
    started = CuttingProxy(api.base, cuts=2)
    yield started
    started.close()


def _check_whole(events: list[StreamEvent], replayed: list[StreamEvent]) -> DoneEvent:
    """``events`` are the request's whole stream, once each: the same ids as a replay from the
    start, and the tokens make the final answer."""
    ids = [e.event_id for e in events]
    assert len(ids) == len(set(ids)), "an event came twice"
    assert ids == [e.event_id for e in replayed], "an event is missing"
    assert isinstance(events[0], SourcesEvent) and events[0].sources
    done = events[-1]
    assert isinstance(done, DoneEvent)
    tokens = "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert done.answer and tokens == done.answer
    return done


def test_query_gives_the_typed_answer(api: Api, workers) -> None:
    with Client(api.base) as client:
        answer = client.query("When does Café Lumière close in the afternoon?", top_k=3)
    assert answer.answer and answer.request_id
    assert len(answer.sources) == 3
    assert answer.sources[0].source.endswith("cafe.md")
    assert answer.timings.total_ms > 0 and answer.usage and answer.usage.completion_tokens > 0


def test_stream_resumes_after_dropped_connections_without_gap_or_repeat(
    api: Api, workers, proxy: CuttingProxy
) -> None:
    with Client(proxy.base) as client:
        events = list(client.stream("Are dogs welcome at Café Lumière, and what does it bake?"))
    assert proxy.cut == 2, "the proxy cut the answer twice (the POST, then the first reconnection)"
    assert proxy.connections == 3
    with Client(api.base) as direct:
        done = _check_whole(events, list(direct.resume(events[-1].request_id)))  # type: ignore[union-attr]
    assert done.request_id


def test_stream_without_resume_raises_where_it_stopped(api: Api, workers, proxy: CuttingProxy) -> None:
    with Client(proxy.base) as client, pytest.raises(StreamInterrupted) as stopped:
        for _ in client.stream("How often should a bicycle chain be oiled, in kilometres?", resume=False):
            pass
    assert proxy.cut == 1
    assert stopped.value.request_id and stopped.value.last_event_id


def test_async_client_streams_resumes_and_waits_for_jobs(api: Api, workers, proxy: CuttingProxy) -> None:
    async def main() -> None:
        async with AsyncClient(proxy.base) as client:
            events = [e async for e in client.stream("What temperature is right for brewing green tea?")]
            replayed = [e async for e in client.resume(events[-1].request_id)]  # type: ignore[union-attr]
            answer = await client.query("On which platform does the regional coast train leave?")
            accepted = await client.submit_job("When is the Vellmar town library closed?")
            job = await client.wait_job(accepted.job_id, timeout=180)
            listed = await client.indexes()
        assert proxy.cut == 2
        _check_whole(events, replayed)
        assert answer.answer and answer.sources[0].source.endswith("trains.txt")
        assert job.status == "done" and job.result and job.result.answer
        assert "test" in [ix.name for ix in listed.indexes]

    asyncio.run(main())


def test_jobs_wait_replay_cancel_and_time_out(api: Api, workers) -> None:
    with Client(api.base) as client:
        first = client.submit_job("What does Café Lumière serve as its speciality?", idempotency_key="k-1")
        again = client.submit_job("What does Café Lumière serve as its speciality?", idempotency_key="k-1")
        assert again.job_id == first.job_id
        done = client.wait_job(first.job_id, timeout=180)
        assert done.status == "done" and done.result and done.result.answer
        with pytest.raises(Conflict, match="already done"):
            client.cancel_job(first.job_id)

        slow = client.submit_job("What pressure does a road bicycle tyre want?")
        with pytest.raises(JobTimeout) as waited:
            client.wait_job(slow.job_id, timeout=0)
        assert waited.value.job.status not in ("done", "failed", "cancelled")
        assert client.cancel_job(slow.job_id).status == "cancelled"
        # A job's events are its request's stream: the cancel is its last event, typed.
        assert isinstance(list(client.resume(slow.job_id))[-1], CancelledEvent)


def test_errors_carry_the_servers_message(api: Api, workers) -> None:
    with Client(api.base, retries=0) as client:
        with pytest.raises(NotFound) as missing:
            client.query("anything", index="no-such-index")
        assert missing.value.error == "unknown_index" and "no-such-index" in missing.value.message
        assert missing.value.request_id
        with pytest.raises(BadRequest):
            client.query("   ")
        with pytest.raises(InvalidRequest):
            list(client.resume("abc", "not-an-event-id"))
        with pytest.raises(PayloadTooLarge):
            client.query("x" * 70_000)
        with pytest.raises(NotFound):
            client.job("0123456789abcdef")


def test_keys_rate_limits_and_an_unavailable_server(
    auth_apis: list[Api], settings: Settings, tmp_path: Path
) -> None:
    base = auth_apis[0].base
    with Client(base, retries=0) as anonymous, pytest.raises(Unauthorized, match="API key is required"):
        anonymous.indexes()

    store = redis.Redis.from_url(settings.redis.redis_url)
    slow_key, _ = apikeys.create(store, Keys(settings.redis.key_prefix), "client-test", rate=0.2, burst=1)
    with Client(base, api_key=slow_key, retries=0) as client:
        client.indexes()
        with pytest.raises(RateLimited) as limited:
            client.indexes()
    assert limited.value.retry_after and limited.value.retry_after >= 1

    # Retried after the Retry-After the server gave (1 s at 1 request/s).
    key, _ = apikeys.create(store, Keys(settings.redis.key_prefix), "client-retry", rate=1, burst=1)
    with Client(base, api_key=key, retries=1) as client:
        client.indexes()
        assert client.indexes().indexes

    # An API whose Redis is gone cannot check keys: 503 with Retry-After, said plainly.
    with (
        api_without_redis(settings, tmp_path / "api.log") as orphan,
        Client(orphan.base, api_key=key, retries=0) as client,
        pytest.raises(Unavailable) as down,
    ):
        client.indexes()
    assert down.value.retry_after == 1 and "API key" in down.value.message
