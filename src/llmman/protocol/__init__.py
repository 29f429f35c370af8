"""Pure translation between the dialects llmman speaks and llama-server's OpenAI-style API.

No I/O here: no sockets, no files, no clocks (timestamps and durations are passed in).

- :mod:`.framing`: SSE and NDJSON encoders and incremental byte-level decoders.
- :mod:`.ollama`: body/model parsing and the ``options``/``format``/``think`` field mappings.
- :mod:`.ollama_request`: ``/api/chat`` and ``/api/generate`` bodies -> :class:`UpstreamRequest`.
- :mod:`.ollama_stream`: llama-server stream chunks -> Ollama NDJSON objects (:class:`OllamaStream`).
- :mod:`.openai`: OpenAI error bodies, request peeking, ``/v1/models``, which llama-server 500s are bad
  requests.
- :mod:`.openai_validate`: the OpenAI request checks (chat, completions, embeddings) before passthrough.
- :mod:`.anthropic`: Anthropic Messages preparation, thinking mapping, answer fix-ups and the SSE transducer.
- :mod:`.anthropic_validate`: Anthropic's request checks.
- :mod:`.anthropic_tools`: forced ``tool_choice`` translated to a JSON-schema grammar on chat completions.
- :mod:`.capabilities`: Ollama's capability checks, for every dialect.
- :mod:`.responses`: the Codex clean-ups for ``/v1/responses``.
- :mod:`.embeddings`: ``/api/embed`` and ``/api/embeddings`` <-> ``/v1/embeddings``, over-long inputs.
- :mod:`.model_echo`: the client's model name in place of the child's alias in passed-through answers.
"""

from __future__ import annotations

from llmman.protocol.framing import (
    SSE_DONE,
    FrameError,
    NDJSONDecoder,
    SSEDecoder,
    SSEEvent,
    ndjson,
    parse_data,
    sse,
)
from llmman.protocol.ollama import (
    RunnerOptions,
    format_to_response_format,
    options_to_sampling,
    parse_json_body,
    require_model,
    runner_options,
    unknown_options,
)
from llmman.protocol.ollama_request import UpstreamRequest, chat_request, generate_request
from llmman.protocol.ollama_stream import OllamaStream, error_line, load_response
from llmman.protocol.openai import ModelEntry, models_list, openai_error, peek_model, wants_stream

__all__ = [
    "SSE_DONE",
    "FrameError",
    "ModelEntry",
    "NDJSONDecoder",
    "OllamaStream",
    "RunnerOptions",
    "SSEDecoder",
    "SSEEvent",
    "UpstreamRequest",
    "chat_request",
    "error_line",
    "format_to_response_format",
    "generate_request",
    "load_response",
    "models_list",
    "ndjson",
    "openai_error",
    "options_to_sampling",
    "parse_data",
    "parse_json_body",
    "peek_model",
    "require_model",
    "runner_options",
    "sse",
    "unknown_options",
    "wants_stream",
]
