#!/usr/bin/env bash
# Installs the toolkit with its test extras into the virtual environment .venv
# (see venv.sh; COLIBRI_VENV=DIR for another) and runs the test suite there.
# Arguments go to pytest: scripts/test.sh -m "not slow" is the fast tier.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-system-deps.sh --test
source scripts/venv.sh   # never the system's Python (PEP 668)
# torch first and pinned, the CPU build: PyPI's Linux x86-64 torch is the CUDA
# build (GBs with its nvidia-* wheels), so it comes from PyTorch's CPU index
# (COLIBRI_TORCH_INDEX), unless pip finds it without an index (already
# installed, or a wheel in PIP_FIND_LINKS, as on CI).
torch_index="${COLIBRI_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
echo "test.sh: installing torch 2.13.0, the CPU build (a 190 MB download, 750 MB installed)..." >&2
if "$py" -m pip install -q --dry-run --no-index --no-deps "torch==2.13.0" >/dev/null 2>&1; then
  "$py" -m pip install -q "torch==2.13.0"
else
  "$py" -m pip install -q --index-url "$torch_index" "torch==2.13.0"
fi
# The extension for this machine's CPU (the default is the portable baseline,
# whose scalar kernels make the parity tests about 3x slower); it is built
# here and never leaves this machine. --config-settings, not -C: Debian 12's
# pip 23.0 lacks the short form.
echo "test.sh: installing colibri-build with its test extras (compiles the Python binding; transformers," \
     "openai, tokenizers, gguf, ziglang...)..." >&2
"$py" -m pip install -q ".[test,parity]" --config-settings=cmake.define.COLIBRI_PY_TARGET=native
echo "test.sh: running the tests (pytest -q $*)" >&2
"$py" -m pytest -q --durations=15 "$@"
