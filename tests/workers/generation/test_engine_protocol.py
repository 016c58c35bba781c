"""Both engines implement the Engine Protocol: checked at run time (each method takes what the
Protocol names, as it names it) and, where mypy is installed, statically."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from ragline.broker.config.settings import GenerationSettings
from ragline.workers.generation.engine import EngineHost
from ragline.workers.generation.engine_protocol import Engine
from ragline.workers.generation.hf_engine import TransformersEngine

ENGINES = [EngineHost, TransformersEngine]
REPO = Path(__file__).resolve().parents[3]


def _protocol_methods() -> list[str]:
    return [name for name, value in vars(Engine).items() if inspect.isfunction(value) and name[0] != "_"]


@pytest.mark.parametrize("engine", ENGINES)
def test_an_engine_is_an_engine_without_starting(engine: type[Engine]) -> None:
    assert issubclass(engine, Engine)
    assert isinstance(engine(GenerationSettings(), "/no/model"), Engine)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("method", _protocol_methods())
def test_each_method_takes_what_the_protocol_names(engine: type[Engine], method: str) -> None:
    wanted = inspect.signature(getattr(Engine, method))
    found = inspect.signature(getattr(engine, method))
    for name, param in wanted.parameters.items():
        assert name in found.parameters, f"{engine.__name__}.{method} lacks {name}"
        have = found.parameters[name]
        assert (have.kind, have.default, have.annotation) == (param.kind, param.default, param.annotation)
    for name, extra in found.parameters.items():
        if name not in wanted.parameters:  # an engine's own option, never required of a caller
            assert extra.default is not inspect.Parameter.empty, f"{engine.__name__}.{method}: {name}"
    assert found.return_annotation == wanted.return_annotation


def test_the_engines_conform_statically(tmp_path: Path) -> None:
    """mypy holds each engine to the Protocol it declares as its base."""
    mypy = pytest.importorskip("mypy.api")
    # mypy cannot follow ragline/__init__.py's path extension: lay the packages out as installed.
    package = tmp_path / "ragline"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for part in ("broker", "workers"):
        (package / part).symlink_to(REPO / part, target_is_directory=True)
    modules = ["engine_protocol", "engine", "hf_engine"]
    args = ["--follow-imports=skip", "--ignore-missing-imports", "--no-incremental"]
    for module in modules:
        args += ["-m", f"ragline.workers.generation.{module}"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MYPYPATH", str(tmp_path))
        report, errors, status = mypy.run(args)
    assert status == 0, report + errors
