# The two commands of the README. Each does all of its own set-up (scripts/setup.sh) and is idempotent.
.PHONY: serve test lint unit bench setup

VENV := .venv
BIN := $(VENV)/bin

setup:
	@scripts/setup.sh --model >/dev/null

# The main job: a daemon serving SmolLM2-135M-Instruct as smollm2:135m, in the foreground.
serve: setup
	@$(BIN)/llmman list | grep -q 'docker.io/ai/smollm2:135m' || \
	  $(BIN)/llmman build -t smollm2:135m $$HOME/.cache/llmman/models/SmolLM2-135M-Instruct.Q4_1.gguf
	$(BIN)/llmman serve

# Every test tier plus the linters and mypy; .ci/run calls exactly this.
test: setup lint
	LLMMAN_TEST_MODEL=$$HOME/.cache/llmman/models/SmolLM2-135M-Instruct.Q4_1.gguf \
	  $(BIN)/python -m pytest -q -p no:cacheprovider tests

lint:
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

unit: setup
	$(BIN)/python -m pytest -q tests/unit

bench: setup
	LLMMAN_TEST_MODEL=$$HOME/.cache/llmman/models/SmolLM2-135M-Instruct.Q4_1.gguf \
	  $(BIN)/python bench/bench_proxy.py
