"""What counts as a default secret, and the secrets `ragline up` keeps under its home."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from ragline.broker.config.secret_policy import (
    SECRETS_FILE,
    DefaultSecret,
    problems,
    refuse_defaults,
    weakness,
    with_stored_secrets,
)
from ragline.broker.config.settings import DEV_WEBHOOK_SECRET, Settings


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (DEV_WEBHOOK_SECRET, "development default"),
        ("ragline", "well-known"),
        ("ADMIN", "well-known"),
        (" change-me ", "well-known"),
        ("short", "shorter than 12"),
        ("elevenchars", "shorter than 12"),
    ],
)
def test_weak_secrets(value: str, why: str) -> None:
    assert why in (weakness(value) or "")


def test_a_real_secret_passes() -> None:
    assert weakness("twelve-chars") is None
    assert weakness("whsec_" + "x" * 40) is None


def test_each_component_checks_what_it_relies_on() -> None:
    s = Settings().replace(webhook_secret=DEV_WEBHOOK_SECRET, flower_password="ragline")
    assert problems(s, ["api"]) == [
        "RAGLINE_WEBHOOK_SECRET is the development default, public in ragline's repository"
    ]
    assert problems(s, ["retrieval", "generation"]) == []
    assert problems(s, ["flower"]) == ["RAGLINE_FLOWER_PASSWORD is a well-known default"]
    with pytest.raises(DefaultSecret, match="ragline api/callbacks/flower refuses to start"):
        refuse_defaults(s, "api", "callbacks", "flower")
    refuse_defaults(s.replace(dev_mode=True), "api", "callbacks", "flower")


def test_first_start_generates_private_secrets_once(tmp_path: Path) -> None:
    fresh = Settings(home=tmp_path)
    filled, created = with_stored_secrets(fresh, generate=True)
    assert set(created) == {"webhook_secret", "flower_password"}
    assert (filled.webhooks.webhook_secret, filled.flower.flower_password) == (
        created["webhook_secret"],
        created["flower_password"],
    )
    refuse_defaults(filled, "api", "callbacks", "flower")
    path = tmp_path / SECRETS_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again, created_again = with_stored_secrets(Settings(home=tmp_path), generate=True)
    assert created_again == {} and again.webhooks.webhook_secret == filled.webhooks.webhook_secret
    assert json.loads(path.read_text())["flower_password"] == filled.flower.flower_password


def test_what_is_set_wins_and_nothing_is_made_unasked(tmp_path: Path) -> None:
    mine = Settings().replace(home=tmp_path, webhook_secret="set-by-the-operator", dev_mode=False)
    assert with_stored_secrets(mine, generate=False) == (mine, {})
    assert not (tmp_path / SECRETS_FILE).exists()
    filled, created = with_stored_secrets(mine, generate=True)
    assert filled.webhooks.webhook_secret == "set-by-the-operator" and set(created) == {"flower_password"}
    # Dev mode never writes secrets anywhere.
    other = tmp_path / "dev"
    assert with_stored_secrets(Settings(home=other, dev_mode=True), generate=True)[1] == {}
    assert not other.exists()
