"""``python -m ragline`` and the ``ragline`` command.

The command runs the server's parts, whose dependencies ``ragline[client]`` leaves out: there it
says what to install instead of a traceback.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    try:
        from ragline.cli import main as run
    except ModuleNotFoundError as exc:
        print(
            f"ragline: the command needs the server's dependencies ({exc.name} is not installed): "
            'pip install "ragline[cpu]" (or "ragline[gpu]")',
            file=sys.stderr,
        )
        return 1
    return run(argv)


if __name__ == "__main__":
    raise SystemExit(main())
