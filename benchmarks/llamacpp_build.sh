#!/usr/bin/env bash
# Builds llama.cpp's llama-bench, llama-quantize and llama-server for this
# machine, for the side-by-side benchmark (benchmarks/side_by_side.py) and the
# parity check on more quantization types (benchmarks/llamacpp_parity.py). llama.cpp's source comes
# from the llama-cpp-python sdist on PyPI, which vendors it; nothing else is
# fetched. A benchmark tool, not a dependency of Colibri or of its tests.
#
#   benchmarks/llamacpp_build.sh [VERSION]     # default: the version below
#
# Result: $COLIBRI_CACHE/llama.cpp-VERSION/ (default ~/.cache/colibri) with
#   src/      the sdist's vendor/llama.cpp (convert_hf_to_gguf.py, gguf-py)
#   bin/      llama-bench, llama-quantize, llama-server
#   build/    CMake's build folder (kept: an interrupted build resumes)
#   VERSION   the llama-cpp-python version and the llama.cpp commit it vendors
# Idempotent: a finished build (bin/ and VERSION present) is left as it is;
# delete the folder to rebuild. Prints the folder on stdout. About 270
# C/C++ files: minutes on an idle machine, an hour or more on a loaded one.
set -euo pipefail

VERSION="${1:-0.3.36}"
CACHE="${COLIBRI_CACHE:-$HOME/.cache/colibri}"
DEST="$CACHE/llama.cpp-$VERSION"
JOBS="${JOBS:-$(nproc)}"

if [[ -x "$DEST/bin/llama-bench" && -x "$DEST/bin/llama-quantize" && -x "$DEST/bin/llama-server" && -f "$DEST/VERSION" ]]; then
    echo "$DEST"
    exit 0
fi
for tool in cmake gcc g++ python3; do
    command -v "$tool" >/dev/null || { echo "llamacpp_build: $tool not found" >&2; exit 1; }
done
mkdir -p "$DEST"
work="$(mktemp -d "$CACHE/.llama.cpp-$VERSION.XXXXXX")"
trap 'rm -rf "$work"' EXIT

sdist="$work/llama_cpp_python-$VERSION.tar.gz"
if [[ ! -d "$DEST/src" ]]; then
    # --no-build-isolation: pip prepares the sdist's metadata with the
    # scikit-build-core already installed instead of building cmake from source.
    python3 -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation \
        "llama-cpp-python==$VERSION" -d "$work" >&2
    [[ -f "$sdist" ]] || { echo "llamacpp_build: pip did not save $sdist" >&2; exit 1; }
    tar -xzf "$sdist" -C "$work"
    top="$work/llama_cpp_python-$VERSION"
    [[ -f "$top/vendor/llama.cpp/CMakeLists.txt" ]] || {
        echo "llamacpp_build: $sdist has no vendor/llama.cpp" >&2; exit 1; }
    # The commit is in the sdist's changelog ("update llama.cpp to ...@HASH"
    # under this version's heading); the sdist has no .git to ask.
    commit="$(awk -v v="## [$VERSION]" '$0 == v {on=1; next} /^## \[/ {on=0}
        on && match($0, /llama\.cpp@[0-9a-f]+/) {print substr($0, RSTART + 10, RLENGTH - 10); exit}' \
        "$top/CHANGELOG.md")"
    echo "${commit:-unknown}" > "$top/vendor/llama.cpp/.vendored-commit"
    mv "$top/vendor/llama.cpp" "$DEST/src"
fi
commit="$(cat "$DEST/src/.vendored-commit")"

# llama.cpp's own CPU defaults (GGML_NATIVE on, its OpenMP threading when
# found, no BLAS); static so bin/ stands alone; only the three tools built.
# Without .git its binaries report build_commit "unknown": VERSION has it.
cmake -S "$DEST/src" -B "$DEST/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF >&2
cmake --build "$DEST/build" --target llama-bench llama-quantize llama-server -j "$JOBS" >&2
mkdir -p "$DEST/bin"
cp "$DEST/build/bin/llama-bench" "$DEST/build/bin/llama-quantize" "$DEST/build/bin/llama-server" "$DEST/bin/"
{
    echo "llama-cpp-python $VERSION"
    echo "llama.cpp $commit"
    echo "cmake -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF ($(gcc --version | head -1))"
    grep -E "^(GGML_NATIVE|GGML_OPENMP|GGML_BLAS|GGML_AVX[A-Z0-9_]*|GGML_CPU_[A-Z0-9_]*):" "$DEST/build/CMakeCache.txt" || true
} > "$DEST/VERSION"
echo "$DEST"
