"""The ``ragline`` command on real parts: ingest refuses index names that leave the index root,
and ``ragline webhooks secret set`` gives a key its own webhook secret."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from broker import webhooks
from broker.keys import Keys
from broker.settings import Settings
from tests.helpers import env_for, finished_job_record
from tests.webhook_receiver import running_receiver

pytestmark = pytest.mark.integration


def _ragline(settings: Settings, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ragline", *args],
        env=env_for(settings),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("name", ["..", ".", "../elsewhere", "a/b", "/abs", "x" * 65, "bad name", "tab\n"])
def test_ingest_refuses_a_name_outside_the_index_root(
    settings: Settings, corpus: Path, tmp_path: Path, name: str
) -> None:
    home = tmp_path / "home"
    (home / "indexes").mkdir(parents=True)
    # Folders beside the index root that a prune of old "versions" would take first (they sort
    # before a version's timestamp).
    for sibling in ("elsewhere/0001-precious", "elsewhere/0002-precious", "0001-precious"):
        (home / sibling).mkdir(parents=True)
        (home / sibling / "keep.txt").write_text("mine")
    before = _tree(home)
    done = _ragline(settings.replace(home=home), "ingest", str(corpus), "--index", name)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "index name" in done.stderr and "letters, digits" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert _tree(home) == before


def test_ingest_refuses_a_bad_default_index(settings: Settings, corpus: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    bad = settings.replace(home=home, default_index="../x")
    done = _ragline(bad, "ingest", str(corpus))
    assert done.returncode == 2 and "'../x'" in done.stderr, done.stderr
    assert list(home.iterdir()) == []


def test_webhooks_secret_set_signs_that_keys_deliveries(
    settings: Settings, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key made with `ragline keys create` gets its own secret from `ragline webhooks secret
    set`; a real delivery of that key's job is signed with it, not with RAGLINE_WEBHOOK_SECRET,
    until `clear`."""
    import workers.callbacks as callbacks

    created = _ragline(settings, "keys", "create", "--name", "hooks-owner")
    assert created.returncode == 0, created.stderr
    key_id = created.stderr.split("created ", 1)[1].split()[0]
    done = _ragline(settings, "webhooks", "secret", "set", key_id)
    assert done.returncode == 0, done.stderr
    secret = done.stdout.strip()
    assert secret.startswith("whsec_") and "shown once" in done.stderr

    monkeypatch.setattr(callbacks, "settings", settings)
    monkeypatch.setattr(callbacks, "keys", Keys(settings.redis.key_prefix))
    monkeypatch.setattr(callbacks, "host_slots", callbacks.HostSlots(4))

    def delivered_signature_verifies(with_secret: str) -> bool:
        url = receiver.url()
        record = finished_job_record(url, owner=key_id)
        assert callbacks.attempt_delivery(record, 1)[0] == "delivered"
        (hook,) = receiver.received(url)
        h = hook.headers
        return webhooks.verify(
            with_secret,
            h["x-ragline-timestamp"],
            h["x-ragline-delivery"],
            hook.body,
            h["x-ragline-signature"],
        )

    with running_receiver() as receiver:
        assert delivered_signature_verifies(secret)
        assert not delivered_signature_verifies(settings.webhooks.webhook_secret)
        brought = "my-own-secret-0123456789"
        assert (
            _ragline(settings, "webhooks", "secret", "set", key_id, "--stdin", stdin=brought + "\n").stdout
            == ""
        )
        assert delivered_signature_verifies(brought)
        assert _ragline(settings, "webhooks", "secret", "clear", key_id).returncode == 0
        assert delivered_signature_verifies(settings.webhooks.webhook_secret)


def test_webhooks_secret_set_refuses_unknown_keys_and_weak_secrets(settings: Settings) -> None:
    unknown = _ragline(settings, "webhooks", "secret", "set", "key_000000000000")
    assert unknown.returncode == 1 and "no key with id 'key_000000000000'" in unknown.stderr
    created = _ragline(settings, "keys", "create", "--name", "weak")
    key_id = created.stderr.split("created ", 1)[1].split()[0]
    weak = _ragline(settings, "webhooks", "secret", "set", key_id, "--stdin", stdin="change-me\n")
    assert weak.returncode == 2 and "well-known default" in weak.stderr
