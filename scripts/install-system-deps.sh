#!/usr/bin/env bash
# System packages the builds need: a C compiler with a static libc, curl,
# binutils/file to inspect executables, and clang for the fuzz test. Installs them when root and missing.
# Cross targets (tests/test_cross.py) also need MinGW-w64, the aarch64 cross
# compiler, wine and qemu: installed the same way, or named when not root
# (their tests then skip, saying what is missing); so are nginx and strace for the
# deployment files' tests.
# Usage: install-system-deps.sh [--test]   (--test: also what the test suite needs)
set -euo pipefail
for_tests=0
[ "${1:-}" = "--test" ] && for_tests=1
need=()
command -v gcc >/dev/null || need+=(gcc)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || [ -e /usr/lib/aarch64-linux-gnu/libc.a ] || need+=(libc6-dev)
command -v curl >/dev/null || need+=(curl)
command -v readelf >/dev/null || need+=(binutils)
command -v file >/dev/null || need+=(file)
cross=()
if [ $for_tests = 1 ]; then
# clang: the libFuzzer target over the request parsers (tests/test_fuzz.py).
command -v clang >/dev/null || need+=(clang)
command -v x86_64-w64-mingw32-gcc >/dev/null || cross+=(gcc-mingw-w64-x86-64)
command -v aarch64-linux-gnu-gcc >/dev/null || cross+=(gcc-aarch64-linux-gnu)
[ -e /usr/aarch64-linux-gnu/lib/libc.a ] || cross+=(libc6-dev-arm64-cross)
{ command -v wine >/dev/null && [ -e /usr/lib/wine/wine64 ] || command -v wine64 >/dev/null; } || cross+=(wine wine64)
command -v qemu-aarch64-static >/dev/null || cross+=(qemu-user-static)
# SIMDe (header-only): the AVX-512 kernels checked on CPUs without AVX-512
# (tests/test_avx512_simde.py).
[ -e /usr/include/simde/x86/avx512.h ] || cross+=(libsimde-dev)
# Deployment files (tests/test_deploy.py): nginx -t on deploy/nginx, strace to
# check the systemd unit's sandbox against the calls the server makes. Optional
# like the cross tools: their tests skip, naming what is missing.
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || cross+=(nginx-light)
command -v strace >/dev/null || cross+=(strace)
# systemd-analyze verifies the unit offline (no running systemd needed).
command -v systemd-analyze >/dev/null || cross+=(systemd)
fi
if [ ${#need[@]} -gt 0 ] || [ ${#cross[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    # apt-get runs quietly: say what is happening, since it can take minutes.
    echo "install-system-deps: updating the apt package lists..." >&2
    apt-get update -qq
    [ ${#need[@]} -eq 0 ] || {
      echo "install-system-deps: installing ${need[*]} with apt-get (only missing ones; the first time only)..." >&2
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    }
    [ ${#cross[@]} -eq 0 ] || {
      echo "install-system-deps: installing the cross-target tools ${cross[*]} with apt-get" \
           "(compilers, wine, qemu, nginx, strace, systemd: the longest step, the first time only)..." >&2
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${cross[@]}" >/dev/null
    }
    echo "install-system-deps: done" >&2
  elif [ ${#need[@]} -gt 0 ]; then
    echo "missing system packages: ${need[*]} (install them with your package manager)" >&2
    exit 1
  else
    echo "note: cross-target or deployment tests will skip; to run them install: ${cross[*]}" >&2
  fi
fi
