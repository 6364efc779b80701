#!/usr/bin/env bash
# The main job on the bundled default model, from a fresh machine:
# install, synthesise a tiny random-weight Mixtral-style model, build its
# static server, start it, send one chat request, stop it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-system-deps.sh
python3 -m pip install -q .
colibri-build synth --arch mixtral --preset tiny models/tiny
colibri-build --model models/tiny/model-config.json --target "${TARGET:-native}"
server="dist/tiny-${TARGET:-native}/colibri-server"
"$server" --model models/tiny --port "${PORT:-8080}" &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 50); do
  curl -sf "localhost:${PORT:-8080}/health" >/dev/null && break
  sleep 0.1
done
curl -s "localhost:${PORT:-8080}/v1/chat/completions" -H 'Content-Type: application/json' \
     -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":16}'
echo
