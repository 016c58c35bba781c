"""ragline: the ``ragline`` command and the Python client here; the server beside them.

The server's packages are ``ragline.api``, ``ragline.broker`` and ``ragline.workers``. A wheel
installs them inside this package; in a source checkout they are the repository's top-level
folders ``api/``, ``broker/`` and ``workers/``, found through this package's path, so a checkout
(a git worktree too) runs its own code whatever is installed. Nothing here imports them: the
client (``ragline.client``) needs only httpx and pydantic.
"""

from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent
if (_CHECKOUT / "broker" / "__init__.py").is_file() and (_CHECKOUT / "pyproject.toml").is_file():
    __path__.append(str(_CHECKOUT))
