"""The door keeps answering on a full Redis: a real API process on a redis-server of the test's
own (maxmemory, noeviction, as ragline deploys it), filled until it refuses writes. A cached
answer is 200, a key past its burst 429 with Retry-After, never 503; a query to compute or a new
job, which Redis has no room to hold, is refused with 503 and Retry-After."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import redis
from ragline.api.query.protocol import QueryResponse
from ragline.broker.config.settings import Settings
from ragline.broker.contract.messages import Done
from ragline.broker.contract.queues import GENERATION_QUEUE, RETRIEVAL_QUEUE
from ragline.broker.redis.keys import Keys
from ragline.broker.state import indexes

from tests.helpers import api_key, redis_server, result_cache_key, start_api

pytestmark = pytest.mark.integration

QUERY = {"query": "When does the café open?", "mode": "retrieval", "top_k": 1}


def _fill(client: redis.Redis) -> None:
    """Past maxmemory: plain keys until refused, then a ballast written as a state script may."""
    limit = int(client.config_get("maxmemory")["maxmemory"])
    i = 0
    while int(client.info("memory")["used_memory"]) < limit:
        try:
            client.set(f"filler:{i}", b"x" * 20_000)
        except redis.exceptions.OutOfMemoryError:
            break
        i += 1
    client.eval(
        "#!lua flags=allow-oom\nreturn redis.call('SET', KEYS[1], ARGV[1])", 1, "ballast", b"x" * 10**6
    )
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        client.set("one-more", b"x")


def test_a_full_redis_still_answers_200_and_429_and_refuses_new_jobs_with_503(
    settings: Settings, tmp_path: Path
) -> None:
    with redis_server(tmp_path, maxmemory="16mb") as client:
        port = client.connection_pool.connection_kwargs["port"]
        s = settings.replace(
            redis_url=f"redis://127.0.0.1:{port}/0", auth_enabled=True, request_timeout_s=1.0
        )
        keys = Keys(s.redis.key_prefix)
        indexes.register(
            client, keys, indexes.IndexInfo(name="test", version="v1", path="/nowhere", chunks=1, dim=384)
        )
        # Workers that look alive (no process: nothing answers), so admission lets the query in.
        for queue in (RETRIEVAL_QUEUE, GENERATION_QUEUE):
            client.zadd(keys.workers(queue), {"planted": time.time() + 3600})
        key, _ = api_key(s, rate=0.001, burst=4)
        jobs_key, _ = api_key(s)
        api = start_api(s, tmp_path / "api.log")
        try:
            with httpx.Client(base_url=api.base, timeout=30) as http:
                auth = {"Authorization": f"Bearer {key}"}
                first = http.post("/v1/query", json=QUERY, headers=auth)  # nothing answers
                assert first.status_code == 504, first.text
                # Its claim is let go after the 504, so the entry's key is made as the API makes it.
                entry = result_cache_key(s, QUERY)
                cached = QueryResponse.from_done(Done(answer=None, cached=True), request_id="", sources=[])
                client.set(entry, cached.model_dump_json(exclude={"request_id"}))
                client.delete(f"{entry}:sf")
                _fill(client)

                answers = [http.post("/v1/query", json=QUERY, headers=auth) for _ in range(3)]
                assert [r.status_code for r in answers] == [200, 200, 200], answers[-1].text
                assert all(r.json()["cached"] for r in answers)
                other = {**QUERY, "query": "Who bakes the buns?"}  # to compute: no room for its task
                uncached = http.post("/v1/query", json=other, headers={"Authorization": f"Bearer {jobs_key}"})
                assert uncached.status_code == 503 and uncached.headers["Retry-After"], uncached.text
                refused = http.post("/v1/query", json=QUERY, headers=auth)  # the burst of 4 is spent
                assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 0, refused.text

                job = http.post("/v1/jobs", json=QUERY, headers={"Authorization": f"Bearer {jobs_key}"})
                assert job.status_code == 503 and job.headers["Retry-After"], job.text
        finally:
            api.proc.stop()
