"""The versions a daemon reports: the Ollama API level it implements, and its own.

``/api/version`` answers :data:`OLLAMA_API_VERSION`, the Ollama release whose API llmman covers (the one
docs/compatibility.md is written against), because clients compare that number with the Ollama they need
(VS Code's Copilot Chat wants at least 0.6.4; Open WebUI parses it as integers). llmman's own version is
in the :data:`VERSION_HEADER` header of every answer and in ``/llmman/node``.
"""

from __future__ import annotations

__all__ = ["OLLAMA_API_VERSION", "VERSION_HEADER"]

#: The Ollama release whose HTTP API llmman implements (numeric, as clients parse it).
OLLAMA_API_VERSION = "0.32.7"
#: The response header naming llmman's own version.
VERSION_HEADER = "x-llmman-version"
