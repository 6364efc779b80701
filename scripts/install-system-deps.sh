#!/usr/bin/env bash
# System packages the builds need: a C compiler with a static libc, curl,
# binutils/file to inspect executables, and clang for the fuzz test. Installs them when root and missing.
set -euo pipefail
need=()
command -v gcc >/dev/null || need+=(gcc)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || [ -e /usr/lib/aarch64-linux-gnu/libc.a ] || need+=(libc6-dev)
command -v curl >/dev/null || need+=(curl)
command -v readelf >/dev/null || need+=(binutils)
command -v file >/dev/null || need+=(file)
# clang: the libFuzzer target over the request parsers (tests/test_fuzz.py).
command -v clang >/dev/null || need+=(clang)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "missing system packages: ${need[*]} (install them with your package manager)" >&2
    exit 1
  fi
fi
