#!/usr/bin/env bash
# Builds the release archives of one model, as .github/workflows/release.yml
# does (it calls this once per target): per target the dist folder as
# OUT/<model>-<target>.tar.gz (.zip for Windows), plus OUT/SHA256SUMS.
# Targets whose compiler is missing here are skipped, saying so (--strict: an
# error). OUT must be new or empty unless --force.
# Usage: MODEL=path/model-config.json scripts/release.sh [--target T]... [--out DIR] [--strict] [--force]
#   MODEL unset or empty: a synthetic tiny model (colibri-build synth), made
#   once under build/release-model/.
# Needs colibri-build (pip install .; ".[zig]" for macos-arm64) and the
# compilers of scripts/install-system-deps.sh --test.
set -euo pipefail
if [ -z "${MODEL:-}" ]; then
  MODEL=build/release-model/tiny/model-config.json
  if [ ! -e "$MODEL" ]; then
    colibri-build synth --arch mixtral --preset tiny --seed 7 build/release-model/tiny >/dev/null
  fi
fi
exec colibri-build release --model "$MODEL" "$@"
