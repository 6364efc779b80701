#!/usr/bin/env bash
# The main job on the bundled demo model, from a fresh machine: install
# (into the virtual environment .venv; see venv.sh), convert the shipped demo
# checkpoint (models/demo: a small Qwen3-MoE trained on the King James Bible
# by scripts/train_demo.py; docs/demo-model.md) to Q8_0 in models/demo-q8_0
# (reused when there), build its static server, start it, send one chat
# request, stop it. Exits non-zero, saying why, when any step fails.
#
# Environment:
#   PORT    the port to serve on; default: a free one the server picks.
#           A PORT that is taken is an error, not a silent fallback.
#   TARGET  the build target (default native; 'colibri-build targets' lists them)
#   COLIBRI_DEMO_MODEL=tiny  a tiny random-weight Mixtral-style model
#           (models/tiny, synthesised) instead: it answers in random bytes
#   COLIBRI_DEMO_SKIP_INSTALL=1  skip the apt and pip steps and the venv: use the
#           colibri-build already on PATH
#   COLIBRI_VENV  the virtual environment's folder (default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
target="${TARGET:-native}"
say() { echo "demo: $*" >&2; }

if [ "${COLIBRI_DEMO_SKIP_INSTALL:-0}" != 1 ]; then
  bash scripts/install-system-deps.sh
  source scripts/venv.sh   # .venv, first on PATH: never the system's Python (PEP 668)
  say "installing colibri-build into $VIRTUAL_ENV with pip (compiles the Python binding; about a minute the first time)..."
  "$py" -m pip install -q .
fi
case "${COLIBRI_DEMO_MODEL:-demo}" in
  demo)
    model=models/demo-q8_0
    # Sampled (temperature 0.6, top_p 0.9, seed 1): greedy decoding makes a model this
    # small repeat itself.
    question="Who is the God of Israel?"
    sampling=',"temperature":0.6,"top_p":0.9,"seed":1'
    if [ -f $model/model-config.json ]; then
      say "using $model (already there)"
    elif [ -f models/demo/model.safetensors ]; then
      colibri-build convert models/demo $model --dtype q8_0
    else
      say "models/demo/model.safetensors is missing: is this a full checkout? (or set COLIBRI_DEMO_MODEL=tiny)"
      exit 1
    fi ;;
  tiny)
    model=models/tiny
    question="Hello"
    sampling=""
    if [ -f $model/model-config.json ]; then
      say "using $model (already there)"
    else
      colibri-build synth --arch mixtral --preset tiny $model
    fi ;;
  *)
    say "COLIBRI_DEMO_MODEL is '${COLIBRI_DEMO_MODEL}'; expected demo (the default) or tiny"
    exit 1 ;;
esac
colibri-build --model $model/model-config.json --target "$target"
server="dist/$(basename $model)-$target/colibri-server"

log=$(mktemp)
"$server" --model $model --port "${PORT:-0}" 2>"$log" &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -f "$log"' EXIT
# The port comes from the server's own "listening on" line, so a port taken
# by another program can never be mistaken for this server.
port=""
for _ in $(seq 300); do
  port=$(sed -n 's|.*listening on http://[^ ]*:\([0-9][0-9]*\).*|\1|p' "$log" | head -n 1)
  [ -n "$port" ] && break
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid" || true
    say "the server did not start${PORT:+ on port $PORT}:"
    cat "$log" >&2
    [ -z "${PORT:-}" ] || say "is port $PORT taken? choose another with PORT=..., or leave PORT unset for a free one"
    exit 1
  fi
  sleep 0.1
done
if [ -z "$port" ]; then
  say "the server did not report a port within 30 s:"
  cat "$log" >&2
  exit 1
fi
say "server $server listening on 127.0.0.1:$port"
curl -sSf "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
     -d "{\"messages\":[{\"role\":\"user\",\"content\":\"$question\"}],\"max_tokens\":48$sampling}"
echo
