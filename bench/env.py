"""The environment a benchmark gives the ragline processes it starts: its Settings, as RAGLINE_ variables."""

from __future__ import annotations

import os
from pathlib import Path

from ragline.broker.config.settings import Settings


def settings_env(settings: Settings, **extra: str) -> dict[str, str]:
    """This process's environment plus every setting (lists and dicts as JSON, as
    pydantic-settings reads them)."""
    env = dict(os.environ) | settings.environment()
    # Importing vLLM on a CPU sets LD_PRELOAD (torch's OpenMP, tcmalloc) for the engine processes
    # it spawns; a child of the benchmark that is no engine (the API, retrieval) must not load them.
    env.pop("LD_PRELOAD", None)
    # A benchmark's processes live on this machine for one run: development secrets will do.
    env.update(
        HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", RAGLINE_DEV_MODE="true"
    )
    env.update(extra)
    return env


def share_models(home: Path) -> None:
    """Point ``home``'s models folder at the default one, so every benchmark home converts the
    model once. The default folder is made first: a link to nothing reads as absent, and the
    model's preparation cannot make a folder where the link stands."""
    models = home / "models"
    if not models.is_symlink() and not models.exists():
        home.mkdir(parents=True, exist_ok=True)
        shared = Settings().models_dir
        shared.mkdir(parents=True, exist_ok=True)
        models.symlink_to(shared, target_is_directory=True)
