"""The environment a benchmark gives the ragline processes it starts: its Settings, as RAGLINE_ variables."""

from __future__ import annotations

import os

from broker.settings import Settings


def settings_env(settings: Settings, **extra: str) -> dict[str, str]:
    """This process's environment plus every setting (lists and dicts as JSON, as
    pydantic-settings reads them)."""
    env = dict(os.environ) | settings.environment()
    # A benchmark's processes live on this machine for one run: development secrets will do.
    env.update(
        HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", RAGLINE_DEV_MODE="true"
    )
    env.update(extra)
    return env
