"""Checking an Ollama ``POST /api/create`` body before any work starts (Ollama's ``api.CreateRequest``).

Every field Ollama defines is type-checked (400 with Ollama's wording for a bad value): ``model`` (a name
llmman.refs accepts), ``from`` (string), ``files``/``adapters`` (objects of file name -> digest string),
``quantize``/``template``/``system`` (strings), ``license`` (string or array of strings), ``messages``
(array of ``{role, content}`` objects), ``parameters`` (an object of known Ollama options of the right
types: ``unknown parameter 'x'`` otherwise), ``stream`` (boolean).

``system``, ``parameters``, ``messages`` and ``license`` make a derived model (:mod:`llmman.store.derive`,
applied per request by :mod:`llmman.protocol.model_defaults`). Fields llmman cannot honour (``quantize``,
``adapters``, ``template``, when non-empty) are refused with 501 rather than silently dropped, so a client
never believes a model carries something it does not: llama-server renders prompts with the GGUF's own
Jinja chat template and cannot take Ollama's Go templates, LoRA adapters are not packaged, and llmman does
not quantize (use a GGUF already quantized).
"""

from __future__ import annotations

from llmman.errors import BadRequest, NotImplementedHere
from llmman.protocol.ollama.fields import options_to_sampling, runner_options, unknown_options

UNSUPPORTED = {
    "quantize": "llmman does not quantize; create from a GGUF that is already quantized",
    "adapters": "LoRA adapters are not supported",
    "template": "llama-server uses the chat template inside the GGUF (Jinja); Go templates are not supported",
}


def _string_map(body: dict[str, object], key: str) -> None:
    value = body.get(key)
    if value is None:
        return
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in value.items()):
        raise BadRequest(f"{key} must be an object of file names to sha256 digests")


def check_create_body(body: dict[str, object]) -> None:
    """Raise BadRequest (400) for a wrongly typed field or an invalid ``parameters`` entry, LlmmanError
    (501) for a non-empty ``quantize``, ``adapters`` or ``template``; see the module docstring."""
    for key in ("from", "quantize", "template", "system"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise BadRequest(f"{key} must be a string")
    _string_map(body, "files")
    _string_map(body, "adapters")
    license_ = body.get("license")
    if license_ is not None and not isinstance(license_, str) and not (
            isinstance(license_, list) and all(isinstance(x, str) for x in license_)):
        raise BadRequest("license must be a string or an array of strings")
    messages = body.get("messages")
    if messages is not None and not (isinstance(messages, list) and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content", ""), str)
            for m in messages)):
        raise BadRequest("messages must be an array of {role, content} objects")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise BadRequest("stream must be a boolean")
    parameters = body.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise BadRequest("parameters must be an object")
        unknown = unknown_options(parameters)
        if unknown:
            raise BadRequest(f"unknown parameter '{unknown[0]}'")
        options_to_sampling(parameters)  # raises: option "x" must be of type ...
        runner_options(parameters)
    for key, why in UNSUPPORTED.items():
        if body.get(key):
            raise NotImplementedHere(f"'{key}' in /api/create is not supported by llmman: {why}")
