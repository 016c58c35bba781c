"""The delivery attempt and the schedule poller, in-process, against a real receiver and Redis."""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

import workers.callbacks as callbacks
from broker import jobs, ssrf, webhooks
from broker.keys import Keys
from broker.settings import Settings
from tests.webhook_receiver import Receiver, running_receiver

PREFIX = "ragline-test-callbacks"


@pytest.fixture
def cfg(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    s = Settings(
        redis_url=redis_url, key_prefix=PREFIX, webhook_host_allowlist=["127.0.0.1"], webhook_timeout_s=2
    )
    monkeypatch.setattr(callbacks, "settings", s)
    monkeypatch.setattr(callbacks, "keys", Keys(PREFIX))
    return s


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with running_receiver() as r:
        yield r


def _record(url: str) -> dict[str, str]:
    rec = jobs.new_record(
        job_id=uuid.uuid4().hex,
        owner="carol",
        request={"query": "q", "top_k": 1, "mode": "retrieval", "index": "i"},
        webhook_url=url,
        metadata={"a": 1},
        now=time.time(),
    )
    return {**rec, "status": "done", "done_at": repr(time.time()), "result": json.dumps({"answer": None})}


def test_attempt_posts_the_signed_final_json(cfg: Settings, receiver: Receiver) -> None:
    url = receiver.url()
    record = _record(url)
    outcome, last = callbacks.attempt_delivery(record, 2)
    assert outcome == "delivered" and last["status_code"] == 200 and last["attempt"] == 2
    (hook,) = receiver.received(url)
    assert json.loads(hook.body) == jobs.view(record, delivery=False)
    h = hook.headers
    assert webhooks.verify(cfg.webhook_secret, h["x-ragline-timestamp"], hook.body, h["x-ragline-signature"])
    assert h["x-ragline-delivery"] == record["delivery_id"] and h["x-ragline-attempt"] == "2"


@pytest.mark.parametrize(
    ("status", "outcome"), [(204, "delivered"), (410, "gone"), (500, "retry"), (302, "retry")]
)
def test_outcome_by_status(cfg: Settings, receiver: Receiver, status: int, outcome: str) -> None:
    assert callbacks.attempt_delivery(_record(receiver.url(status)), 1)[0] == outcome


def test_refused_at_delivery_when_not_allowlisted(cfg: Settings, receiver: Receiver) -> None:
    allowed = receiver.url()
    url = allowed.replace("127.0.0.1", "localhost")  # the same receiver, by a name off the allowlist
    outcome, last = callbacks.attempt_delivery(_record(url), 1)
    assert outcome == "retry" and last["error"].startswith("refused:") and last["status_code"] is None
    assert receiver.received(allowed) == []


def test_connection_errors_are_retried(cfg: Settings) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    outcome, last = callbacks.attempt_delivery(_record(f"http://127.0.0.1:{port}/x"), 1)
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
    outcome, last = callbacks.attempt_delivery(_record(url), 1)
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


def test_poller_enqueues_due_attempts_once(
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
    assert client.zrange(keys.webhook_schedule, 0, -1) == [b"job-b:3"]
