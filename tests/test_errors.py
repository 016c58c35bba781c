"""Every exception ragline defines derives from RaglineError: one base, each side's own below it."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILTIN_ERRORS = {
    n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)
}


def _classes() -> dict[str, tuple[str, list[str]]]:
    """Every class of api/, broker/ and workers/: name -> (where, base names)."""
    found: dict[str, tuple[str, list[str]]] = {}
    for top in ("api", "broker", "workers"):
        for path in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
                    found[node.name] = (f"{path.relative_to(ROOT)}:{node.lineno}", bases)
    return found


def test_every_exception_derives_from_ragline_error() -> None:
    classes = _classes()

    def is_exception(name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name in BUILTIN_ERRORS:
            return True
        if name not in classes or name in seen:
            return False
        return any(is_exception(b, seen | {name}) for b in classes[name][1])

    def ours(name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name == "RaglineError":
            return True
        if name not in classes or name in seen:
            return False
        return any(ours(b, seen | {name}) for b in classes[name][1])

    loose = [
        f"{where} {name}" for name, (where, _) in classes.items() if is_exception(name) and not ours(name)
    ]
    assert loose == [], "exceptions outside RaglineError's tree"
