"""The delivery attempt and the schedule poller, in-process, against a real receiver and Redis."""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest
import ragline.workers.callbacks as callbacks
import redis
from ragline.broker.config.settings import Settings
from ragline.broker.contract.records import JobRecord, JobView
from ragline.broker.limits import ssrf
from ragline.broker.redis.keys import Keys
from ragline.broker.state import webhooks

from ragline import processes
from tests.helpers import env_for, finished_job_record, free_port
from tests.webhook_receiver import Receiver, running_receiver, running_trickler

PREFIX = "ragline-test-callbacks"


@pytest.fixture
def cfg(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    s = Settings().replace(
        redis_url=redis_url, key_prefix=PREFIX, webhook_host_allowlist=["127.0.0.1"], webhook_timeout_s=2
    )
    monkeypatch.setattr(callbacks, "settings", s)
    monkeypatch.setattr(callbacks, "keys", Keys(PREFIX))
    monkeypatch.setattr(callbacks, "host_slots", callbacks.HostSlots(s.webhooks.webhook_host_concurrency))
    return s


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with running_receiver() as r:
        yield r


def test_attempt_posts_the_signed_final_json(cfg: Settings, receiver: Receiver) -> None:
    url = receiver.url()
    record = finished_job_record(url)
    outcome, last = callbacks.attempt_delivery(record, 2)
    assert outcome == "delivered" and last["status_code"] == 200 and last["attempt"] == 2
    (hook,) = receiver.received(url)
    assert hook.body == JobView.of(JobRecord.decode(record), delivery=False).webhook_body()
    body = json.loads(hook.body)
    assert "webhook" not in body and body["job_id"] == record["id"] and body["status"] == "done"
    assert body["request"]["query"] == "q" and body["metadata"] == {"a": 1}
    h = hook.headers
    timestamp, signature = h["x-ragline-timestamp"], h["x-ragline-signature"]
    # Its owner has no secret of its own: the one derived for it signs.
    derived = webhooks.derived_secret(cfg.webhooks.webhook_secret, record["owner"])
    assert webhooks.verify(derived, timestamp, record["delivery_id"], hook.body, signature)
    assert not webhooks.verify(
        cfg.webhooks.webhook_secret, timestamp, record["delivery_id"], hook.body, signature
    )
    assert h["x-ragline-delivery"] == record["delivery_id"] and h["x-ragline-attempt"] == "2"


@pytest.mark.parametrize(
    ("status", "outcome"), [(204, "delivered"), (410, "gone"), (500, "retry"), (302, "retry")]
)
def test_outcome_by_status(cfg: Settings, receiver: Receiver, status: int, outcome: str) -> None:
    assert callbacks.attempt_delivery(finished_job_record(receiver.url(status)), 1)[0] == outcome


def test_refused_at_delivery_when_not_allowlisted(cfg: Settings, receiver: Receiver) -> None:
    allowed = receiver.url()
    url = allowed.replace("127.0.0.1", "localhost")  # the same receiver, by a name off the allowlist
    outcome, last = callbacks.attempt_delivery(finished_job_record(url), 1)
    assert outcome == "retry" and last["error"].startswith("refused:") and last["status_code"] is None
    assert receiver.received(allowed) == []


def test_connection_errors_are_retried(cfg: Settings) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    outcome, last = callbacks.attempt_delivery(finished_job_record(f"http://127.0.0.1:{port}/x"), 1)
    assert outcome == "retry" and "ConnectError" in last["error"]


def test_delivery_connects_to_the_checked_address(
    cfg: Settings, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: the name answers a (here: pretend-public) address once, then something else.
    The POST must go to the address the guard checked, with the name in the Host header."""
    real = socket.getaddrinfo
    answers = iter(["127.0.0.1"])

    def rebinding(host: str, port: object, *args: object, **kwargs: object) -> list:
        if host == "rebind.example.test":
            try:
                return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), port))]
            except StopIteration:
                raise socket.gaierror("rebound") from None
        return real(host, port, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    monkeypatch.setattr(ssrf, "refusal", lambda ip: None)
    url = receiver.url().replace("127.0.0.1", "rebind.example.test")
    outcome, last = callbacks.attempt_delivery(finished_job_record(url), 1)
    assert outcome == "delivered", last
    port = url.split(":")[2].split("/")[0]
    (hook,) = [r for r in receiver.requests if url.endswith(r.path)]
    assert hook.headers["host"] == f"rebind.example.test:{port}"


def test_https_keeps_the_name_for_tls() -> None:
    target = ssrf.Target(
        "https://hooks.example.com/in?a=1", "https", "hooks.example.com", 443, ("93.184.215.14",), False
    )
    url, headers, extensions = callbacks._request_for(target)
    assert url == "https://93.184.215.14/in?a=1"
    assert headers == {"Host": "hooks.example.com"}
    assert extensions == {"sni_hostname": "hooks.example.com"}
    v6 = ssrf.Target("http://[2001:db8::1]:8080/", "http", "2001:db8::1", 8080, ("2001:db8::1",), False)
    assert callbacks._request_for(v6)[:2] == ("http://[2001:db8::1]:8080/", {"Host": "[2001:db8::1]:8080"})


def test_poller_enqueues_due_attempts_once_per_lease(
    cfg: Settings, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = Keys(PREFIX)
    client.delete(keys.webhook_schedule)
    sent: list[dict] = []
    monkeypatch.setattr(callbacks.app, "send_task", lambda name, kwargs, queue: sent.append(kwargs))
    client.zadd(keys.webhook_schedule, {"job-a:1": time.time() - 1, "job-b:3": time.time() + 60})
    poller = callbacks.SchedulePoller()
    assert poller.poll_once() == 1
    assert sent == [{"job_id": "job-a", "attempt": 1}]
    assert poller.poll_once() == 0
    # Sent, not yet claimed: still scheduled, leased until the task's claim removes it.
    (leased,) = client.zrangebyscore(keys.webhook_schedule, time.time() + 1, time.time() + 40)
    assert leased == b"job-a:1"


def test_a_trickling_receiver_is_cut_off_at_the_deadline(
    cfg: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every read gets a byte well within the per-read timeout; the attempt still ends at its
    overall deadline, long before the receiver would have finished its answer."""
    monkeypatch.setattr(cfg.webhooks, "webhook_timeout_s", 5.0)
    monkeypatch.setattr(cfg.webhooks, "webhook_deadline_s", 1.0)
    with running_trickler(byte_every_s=0.25) as trickler:  # about 20 s for the whole answer
        outcome, last = callbacks.attempt_delivery(finished_job_record(trickler.base + "/hook"), 1)
        assert outcome == "retry" and last["error"].startswith("deadline"), last
        assert last["status_code"] is None
        assert trickler.wait("cut_off", 1, timeout=10) == 1 and trickler.completed == 0


def test_one_host_holds_at_most_its_share_of_delivery_threads(
    cfg: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With two slots per host, a third attempt to a slow host is deferred (it never connects,
    and costs no attempt) while the first two hang on the receiver."""
    monkeypatch.setattr(cfg.webhooks, "webhook_deadline_s", 3.0)
    monkeypatch.setattr(callbacks, "host_slots", callbacks.HostSlots(2))
    with running_trickler(byte_every_s=1.0) as trickler, ThreadPoolExecutor(3) as pool:
        slow = [
            pool.submit(callbacks.attempt_delivery, finished_job_record(trickler.base + "/hook"), 1)
            for _ in range(2)
        ]
        assert trickler.wait("connections", 2, timeout=10) == 2
        outcome, last = callbacks.attempt_delivery(finished_job_record(trickler.base + "/hook"), 1)
        assert outcome == "deferred" and "2 deliveries to '127.0.0.1' already in flight" in last["error"]
        assert [f.result()[0] for f in slow] == ["retry", "retry"]
        assert trickler.connections == 2
    # the slots come back once the attempts end
    assert callbacks.host_slots.acquire("127.0.0.1") and callbacks.host_slots.acquire("127.0.0.1")


def test_a_saturated_resolver_defers_the_attempt(
    cfg: Settings, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ssrf, "_resolver", ssrf.Resolver(threads=1, queued=0))
    url = "http://hooks.example.test/in"  # a name: it needs the resolver
    outcome, last = callbacks.attempt_delivery(finished_job_record(url), 1)
    assert outcome == "deferred" and "saturated" in last["error"], last


@pytest.mark.integration
def test_the_worker_serves_metrics_on_loopback_only(settings: Settings, tmp_path: Path) -> None:
    """A real callbacks worker with RAGLINE_WORKER_METRICS_PORT set: /metrics answers (the pod's
    probes read it) and listens on 127.0.0.1 only unless RAGLINE_WORKER_METRICS_HOST says otherwise."""
    port = free_port()
    log = tmp_path / "callbacks.log"
    env = env_for(settings.replace(worker_metrics_port=port))
    env.pop("RAGLINE_WORKER_METRICS_HOST")  # the default
    with processes.Supervisor(grace_s=5.0) as sup, log.open("ab") as out:
        child = sup.start(
            "callbacks", [sys.executable, "-m", "ragline", "worker", "callbacks"], env, stdout=out
        )
        deadline = time.monotonic() + 60
        while True:
            assert child.proc.poll() is None, log.read_text()[-3000:]
            try:
                reply = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.3)
        assert reply.status_code == 200 and "ragline_webhook_deliveries_total" in reply.text
        worker = psutil.Process(child.proc.pid)
        listening = {
            (c.laddr.ip, c.laddr.port)
            for p in [worker, *worker.children(recursive=True)]
            for c in p.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN
        }
        assert listening == {("127.0.0.1", port)}, listening
