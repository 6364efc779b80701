#!/usr/bin/env bash
# Installs the toolkit with its test extras and runs the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-system-deps.sh --test
# torch first and pinned: the CPU build (any other spelling pulls a CUDA build).
echo "test.sh: installing torch 2.13.0, the CPU build (a 190 MB download, 750 MB installed)..." >&2
python3 -m pip install -q "torch==2.13.0"
# The extension for this machine's CPU (the default is the portable baseline,
# whose scalar kernels make the parity tests about 3x slower); it is built
# here and never leaves this machine.
echo "test.sh: installing colibri-build with its test extras (compiles the Python binding; transformers," \
     "openai, tokenizers, gguf, ziglang...)..." >&2
python3 -m pip install -q ".[test,parity]" -C cmake.define.COLIBRI_PY_TARGET=native
echo "test.sh: running the tests (pytest -q $*)" >&2
python3 -m pytest -q --durations=15 "$@"
