"""The conformance suite: official client SDKs (anthropic, openai, ollama, litellm) against one real
daemon per module, serving SmolLM2-135M through a real llama-server (fixtures shared with
tests/integration)."""

from __future__ import annotations

from tests.integration.conftest import daemon, model_file

__all__ = ["daemon", "model_file"]
