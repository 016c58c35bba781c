"""Settings grouped per component: every documented variable still lands in its field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import ValidationError
from ragline.broker.config.settings import ENV_PREFIX, GenerationSettings, Settings, owner

DOC = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def documented_names() -> set[str]:
    """Every ``RAGLINE_`` variable in the tables of docs/configuration.md, shorthands such as
    ``RAGLINE_HNSW_M`` / ``_EF_SEARCH`` expanded against the full name before them."""
    text = DOC.read_text().split("## Outside")[0]
    fields = {n for g in Settings.GROUPS.values() for n in g.model_fields} | set(Settings.SHARED)
    names: set[str] = set()
    for line in text.splitlines():
        if not line.startswith("| `"):
            continue
        full = ""
        for token in re.findall(r"`(RAGLINE_[A-Z0-9_]+|_[A-Z0-9_]+)`", line.split("|")[1]):
            if token.startswith(ENV_PREFIX):
                full = token
                names.add(token)
                continue
            # A shorthand replaces the full name's last words: whichever reading names a setting.
            words = full.removeprefix(ENV_PREFIX).split("_")
            found = {
                ENV_PREFIX + "_".join(words[:cut]) + token
                for cut in range(1, len(words))
                if ("_".join(words[:cut]) + token).lower() in fields
            }
            assert found, f"{token} after {full} names no setting"
            names |= found
    return names


def _other_value(annotation: Any, default: Any) -> tuple[str, Any]:
    """A value unlike ``default``: as the environment spells it, and as the field holds it."""
    if annotation is bool:
        return str(not default).lower(), not default
    if annotation is int:
        return str(default + 3), default + 3
    if annotation is float:
        return str(default + 0.5), default + 0.5
    if annotation is Path:
        return "/tmp/ragline-settings-test", Path("/tmp/ragline-settings-test")
    if choices := get_args(annotation):
        if all(isinstance(c, str) for c in choices):  # a Literal
            other = next(c for c in choices if c != default)
            return other, other
        return "a.example,B.example", ["a.example", "b.example"]  # the webhook allowlist
    if isinstance(default, str) and default.startswith("redis://"):  # a URL is checked when read
        return "redis://from-the-environment:6380/1", "redis://from-the-environment:6380/1"
    return "from-the-environment", "from-the-environment"


def test_every_documented_variable_lands_in_its_field(monkeypatch: pytest.MonkeyPatch) -> None:
    names = documented_names()
    assert len(names) > 100  # the tables were read
    expected = {}
    for name in sorted(names):
        field = name.removeprefix(ENV_PREFIX).lower()
        group = owner(field)  # ValueError: documented, but no such setting
        model = Settings.GROUPS[group] if group else Settings
        info = model.model_fields[field]
        default = info.get_default(call_default_factory=True)
        env_value, expected[field] = _other_value(info.annotation, default)
        monkeypatch.setenv(name, env_value)
    settings = Settings()
    for field, value in expected.items():
        group = owner(field)
        held = getattr(getattr(settings, group) if group else settings, field)
        assert held == value, f"{ENV_PREFIX}{field.upper()} did not reach settings.{group}.{field}"


def test_every_setting_is_documented() -> None:
    documented = {n.removeprefix(ENV_PREFIX).lower() for n in documented_names()}
    fields = {n for g in Settings.GROUPS.values() for n in g.model_fields} | set(Settings.SHARED)
    assert fields - documented == set()


def test_no_setting_is_in_two_groups() -> None:
    seen: dict[str, str] = {name: "Settings" for name in Settings.SHARED}
    for group_name, group in Settings.GROUPS.items():
        assert group_name not in seen and Settings.model_fields[group_name].annotation is group
        for field in group.model_fields:
            assert field not in seen, f"{field} is in {seen[field]} and {group_name}"
            assert field not in Settings.GROUPS, f"{field} reads the variable of group {field}"
            seen[field] = group_name


def test_replace_puts_each_value_in_its_group_validated() -> None:
    base = Settings()
    changed = base.replace(
        dtype="bfloat16", torch_threads="3", redis_url="redis://elsewhere:1/0", dev_mode=True
    )
    assert changed.generation.dtype == "bfloat16" and changed.retrieval.torch_threads == 3
    assert changed.redis.redis_url == "redis://elsewhere:1/0" and changed.dev_mode
    assert base.generation.dtype != "bfloat16" or base.redis.redis_url != changed.redis.redis_url
    assert changed.api is base.api  # untouched groups are shared, not copied
    assert "torch_threads=" not in changed.host_defaults_line()
    with pytest.raises(ValueError, match="no setting named 'no_such'"):
        base.replace(no_such=1)
    with pytest.raises(ValidationError):
        base.replace(max_num_seqs="many")


def test_a_flat_name_is_refused_where_groups_are_built() -> None:
    with pytest.raises(ValidationError, match="dtype"):
        Settings(dtype="float32")  # type: ignore[call-arg]
    assert Settings(generation=GenerationSettings(dtype="float32")).generation.dtype == "float32"


def test_the_environment_a_child_gets_rebuilds_the_same_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Settings().replace(webhook_host_allowlist=["hooks.example"], max_top_k=9, home=Path("/tmp/h"))
    for name, value in original.environment().items():
        monkeypatch.setenv(name, value)
    assert Settings().model_dump() == original.model_dump()
