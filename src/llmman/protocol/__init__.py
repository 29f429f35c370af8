"""Pure translation between the dialects llmman speaks and llama-server's OpenAI-style API.

No I/O here: no sockets, no files, no clocks (timestamps and durations are passed in).

- :mod:`.framing`: SSE and NDJSON encoders and incremental byte-level decoders.
- :mod:`.ollama`: ``/api/chat``, ``/api/generate``, embeddings and ``/api/show`` translation.
- :mod:`.openai`: OpenAI error bodies and request checks, Responses clean-ups.
- :mod:`.anthropic`: Anthropic Messages preparation, checks, forced tools and the SSE transducer.
- :mod:`.capabilities`: Ollama's capability checks, for every dialect.
- :mod:`.model_defaults`: a derived model's system prompt, parameters and messages on a request.
- :mod:`.model_echo`: the client's model name in place of the child's alias in passed-through answers.
- :mod:`.json_values`: JSON type tests shared by the validators.
"""
