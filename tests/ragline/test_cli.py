"""The ``ragline`` command on real parts: ingest refuses index names that leave the index root,
and ``ragline webhooks secret set`` gives a key its own webhook secret."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ragline.broker.config.settings import Settings
from ragline.broker.redis.keys import Keys
from ragline.broker.state import webhooks

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
    """A key made with `ragline keys create` signs with a secret derived for it (`ragline webhooks
    secret show`) until `ragline webhooks secret set` gives it its own; a real delivery of that
    key's job is signed with it, never with RAGLINE_WEBHOOK_SECRET itself, and `clear` goes back
    to the derived one."""
    import ragline.workers.callbacks as callbacks

    created = _ragline(settings, "keys", "create", "--name", "hooks-owner")
    assert created.returncode == 0, created.stderr
    key_id = created.stderr.split("created ", 1)[1].split()[0]
    shown = _ragline(settings, "webhooks", "secret", "show", key_id)
    assert shown.returncode == 0 and "derived" in shown.stderr, shown.stderr
    derived = shown.stdout.strip()
    assert derived == webhooks.derived_secret(settings.webhooks.webhook_secret, key_id)
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
        assert _ragline(settings, "webhooks", "secret", "show", key_id).stdout.strip() == secret
        assert not delivered_signature_verifies(settings.webhooks.webhook_secret)
        assert not delivered_signature_verifies(derived)
        brought = "my-own-secret-0123456789"
        assert (
            _ragline(settings, "webhooks", "secret", "set", key_id, "--stdin", stdin=brought + "\n").stdout
            == ""
        )
        assert delivered_signature_verifies(brought)
        assert _ragline(settings, "webhooks", "secret", "clear", key_id).returncode == 0
        # Back to its derived secret, never the deployment's own, which no receiver holds.
        assert delivered_signature_verifies(derived)
        assert not delivered_signature_verifies(settings.webhooks.webhook_secret)
        assert _ragline(settings, "webhooks", "secret", "show", key_id).stdout.strip() == derived


def test_webhooks_secret_set_refuses_unknown_keys_and_weak_secrets(settings: Settings) -> None:
    for command in ("set", "show"):
        unknown = _ragline(settings, "webhooks", "secret", command, "key_000000000000")
        assert unknown.returncode == 1 and "no key with id 'key_000000000000'" in unknown.stderr
    # The one principal that is no key: a deployment without keys signs as `anonymous`.
    anonymous = _ragline(settings, "webhooks", "secret", "show", "anonymous")
    assert anonymous.returncode == 0, anonymous.stderr
    assert anonymous.stdout.strip() == webhooks.derived_secret(settings.webhooks.webhook_secret, "anonymous")
    created = _ragline(settings, "keys", "create", "--name", "weak")
    key_id = created.stderr.split("created ", 1)[1].split()[0]
    weak = _ragline(settings, "webhooks", "secret", "set", key_id, "--stdin", stdin="change-me\n")
    assert weak.returncode == 2 and "well-known default" in weak.stderr


def test_keys_carry_the_scopes_they_are_created_with(settings: Settings, redis_url: str) -> None:
    """`ragline keys create --scope` records them (read by default), `keys list` shows them,
    `keys scopes` changes them, and a scope that is not one is refused before anything is stored."""
    from ragline.broker.redis.pool import sync_client
    from ragline.broker.state import apikeys

    s = settings.replace(key_prefix="ragline-test-cli-scopes")
    client, keys = sync_client(s.redis), Keys(s.redis.key_prefix)
    client.delete(keys.api_keys)
    try:
        made = _ragline(s, "keys", "create", "--name", "writer", "--scope", "write:docs", "--scope", "read")
        assert made.returncode == 0, made.stderr
        assert "scopes read write:docs" in made.stderr
        plain = _ragline(s, "keys", "create", "--name", "plain")
        assert plain.returncode == 0 and "scopes read," in plain.stderr, plain.stderr
        by_name = {r.name: r for r in apikeys.list_keys(client, keys)}
        assert by_name["writer"].scopes == ["read", "write:docs"]
        assert by_name["plain"].scopes == ["read"]
        listed = _ragline(s, "keys", "list")
        assert "read write:docs" in listed.stdout, listed.stdout
        changed = _ragline(s, "keys", "scopes", by_name["plain"].id, "admin")
        assert changed.returncode == 0, changed.stderr
        assert apikeys.list_keys(client, keys)[-1].effective_scopes == ("admin",)
        for bad in ("owner", "write:../x"):
            refused = _ragline(s, "keys", "create", "--name", "bad", "--scope", bad)
            assert refused.returncode == 2 and "scope" in refused.stderr, refused.stderr
            assert "Traceback" not in refused.stderr
        assert len(apikeys.list_keys(client, keys)) == 2
        unknown = _ragline(s, "keys", "scopes", "key_nope", "read")
        assert unknown.returncode == 1 and "no key" in unknown.stderr
    finally:
        client.delete(keys.api_keys)


@pytest.mark.parametrize(
    ("value", "args"),
    [
        ("eu/west", ("--shard-by", "region")),  # a value that is no folder name
        ("x" * 60, ("--shard-by", "region")),  # a shard name over 64 characters
        ("eu", ("--index", "docs.shard-0", "--shards", "2")),  # a shard's own name
    ],
)
def test_sharded_ingest_refuses_a_shard_name_outside_the_rule(
    settings: Settings, tmp_path: Path, value: str, args: tuple[str, ...]
) -> None:
    home = tmp_path / "home"
    (home / "indexes").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(f"---\nregion: {value}\n---\n# A\n\nSome text about the region.")
    index = () if "--index" in args else ("--index", "regions")
    done = _ragline(settings.replace(home=home), "ingest", str(tmp_path / "docs"), *index, *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "not valid" in done.stderr
    assert not any((home / "indexes").iterdir())  # nothing written, nothing embedded


def test_worker_refuses_a_shard_selection_outside_the_rule(settings: Settings) -> None:
    done = _ragline(settings, "worker", "retrieval", "--shards", "docs:a/b")
    assert done.returncode == 2 and "not valid" in done.stderr, done.stderr
    done = _ragline(settings, "worker", "generation", "--shards", "docs:0")
    assert done.returncode == 2 and "retrieval workers" in done.stderr, done.stderr


@pytest.mark.parametrize("shards", [(), ("--shard-by", "region")])
def test_ingest_refuses_front_matter_past_the_metadata_limits(
    settings: Settings, tmp_path: Path, shards: tuple[str, ...]
) -> None:
    home = tmp_path / "home"
    (home / "indexes").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "fine.md").write_text("---\nregion: eu\n---\n# Fine\n\nSome text.")
    keys = "".join(f"k{i}: v\n" for i in range(5))
    (tmp_path / "docs" / "wide.md").write_text(f"---\nregion: eu\n{keys}---\n# Wide\n\nSome text.")
    limited = settings.replace(home=home, metadata_max_keys=4)
    done = _ragline(limited, "ingest", str(tmp_path / "docs"), "--index", "regions", *shards)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "'wide.md'" in done.stderr and "RAGLINE_METADATA_MAX_KEYS" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not any((home / "indexes").iterdir())  # nothing written, nothing embedded
    # --meta counts too.
    done = _ragline(limited, "ingest", str(tmp_path / "docs" / "fine.md"), "--meta", f"note={'x' * 2000}")
    assert done.returncode == 2 and "RAGLINE_METADATA_MAX_VALUE_CHARS" in done.stderr, done.stderr


def test_sharded_ingest_past_the_shard_limit_fails_before_anything_is_written(
    settings: Settings, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    (home / "indexes").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    for region in ("eu", "us", "ap"):
        (tmp_path / "docs" / f"{region}.md").write_text(f"---\nregion: {region}\n---\n# {region}\n\nText.")
    limited = settings.replace(home=home, max_shards_per_index=2)
    for args in (("--shard-by", "region"), ("--shards", "3")):
        done = _ragline(limited, "ingest", str(tmp_path / "docs"), "--index", "regions", *args)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "would have 3 shards" in done.stderr and "RAGLINE_MAX_SHARDS_PER_INDEX" in done.stderr
        assert "Traceback" not in done.stderr
        assert not any((home / "indexes").iterdir())
