# The two commands of the README. Each does all of its own set-up (scripts/setup.sh) and is idempotent.
.PHONY: serve test lint unit bench bench-pool bench-obs bench-scale setup setup-test setup-venv bench-gpu bench-transfer bench-split bench-relay

VENV := .venv
BIN := $(VENV)/bin
# Where scripts/setup.sh keeps the model files (LLMMAN_TEST_MODELS overrides it there too).
MODELS := $(or $(LLMMAN_TEST_MODELS),$(HOME)/.cache/llmman/models)

setup:
	@scripts/setup.sh --model >/dev/null

# The tests also want Gemma 3 270M and (as root) Debian's docker-registry for the registry tests.
setup-test:
	@scripts/setup.sh --test >/dev/null

# The main job: a daemon serving SmolLM2-135M-Instruct as smollm2:135m, in the foreground.
serve: setup
	@$(BIN)/llmman list | grep -q 'docker.io/ai/smollm2:135m' || \
	  $(BIN)/llmman build -t smollm2:135m $(MODELS)/SmolLM2-135M-Instruct.Q4_1.gguf
	$(BIN)/llmman serve

# Every test tier plus the linters and mypy; .ci/run calls exactly this.
test: setup-test lint
	LLMMAN_TEST_MODEL=$(MODELS)/SmolLM2-135M-Instruct.Q4_1.gguf \
	  $(BIN)/python -m pytest -q -p no:cacheprovider tests

lint:
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

# The unit tier needs only the venv: no model, no llama-server (its children are the fake), no registry.
setup-venv:
	@scripts/setup.sh --venv >/dev/null

unit: setup-venv
	$(BIN)/python -m pytest -q tests/unit

bench: setup-test
	LLMMAN_TEST_MODEL=$(MODELS)/SmolLM2-135M-Instruct.Q4_1.gguf \
	  $(BIN)/python bench/bench_proxy.py

# Does the pool serve as one bigger server? Fake llama-servers of fixed capacity: needs only the venv.
bench-pool: setup-venv
	$(BIN)/python bench/bench_pool.py

# What metrics and the request log cost the relay: on vs off, side by side, over the fake llama-server.
bench-obs: setup-venv
	$(BIN)/python bench/bench_relay_obs.py

# How far the leaderless pool goes: 8, 16 and 32 daemons in network namespaces (root; docs/scaling.md).
bench-scale: setup-venv
	$(BIN)/python bench/bench_scale.py

# /v2/ blob copies against nginx and pulls against curl (needs nginx: apt-get install nginx-light).
bench-transfer: setup-venv
	$(BIN)/python bench/bench_transfer.py --rounds 5 --tls

# The daemon's CPU per token relayed (passthrough, Ollama translation, hop), one event per read (docs/performance.md).
bench-relay: setup-venv
	$(BIN)/python bench/bench_relay_cost.py

# One model split over llama.cpp RPC workers against the same model on one node (docs/split.md "Measured").
bench-split: setup-test
	$(BIN)/python bench/bench_split.py

# The proxy benchmark on an NVIDIA GPU at 1, 16 and 256 streams (builds a CUDA llama-server; bench/README.md).
bench-gpu:
	bench/gpu.sh
