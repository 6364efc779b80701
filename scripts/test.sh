#!/usr/bin/env bash
# Installs the toolkit with its test extras and runs the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-system-deps.sh
python3 -m pip install -q ".[test]"
python3 -m pytest -q "$@"
