#!/usr/bin/env bash
# Installs the toolkit with its test extras and runs the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-system-deps.sh --test
# torch first and pinned: the CPU build (any other spelling pulls a CUDA build).
python3 -m pip install -q "torch==2.13.0"
python3 -m pip install -q ".[test,parity]"
python3 -m pytest -q "$@"
