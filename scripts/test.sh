#!/usr/bin/env bash
# Installs the toolkit with its test extras and runs the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-system-deps.sh --test
# torch first and pinned: the CPU build (any other spelling pulls a CUDA build).
echo "test.sh: installing torch 2.13.0, the CPU build (a 190 MB download, 750 MB installed)..." >&2
python3 -m pip install -q "torch==2.13.0"
echo "test.sh: installing colibri-build with its test extras (compiles the Python binding; transformers," \
     "openai, tokenizers, gguf, ziglang...)..." >&2
python3 -m pip install -q ".[test,parity]"
echo "test.sh: running the tests (pytest -q $*)" >&2
python3 -m pytest -q "$@"
