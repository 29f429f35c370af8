"""Applying a derived model's system prompt, parameters and messages to a request, as Ollama does.

Rules (Ollama server/routes.go ChatHandler and GenerateHandler):

* ``parameters`` are defaults UNDER the request's own ``options``: built-in defaults, then the model's
  parameters, then the request (the request wins key by key). A ``stop`` parameter becomes llama-server's
  ``stop``, ``num_predict`` its ``max_tokens`` (:func:`llmman.protocol.ollama.options_to_sampling`).
* ``/api/chat``: the model's messages are put before the request's messages, and its system prompt
  before those unless the request's first message is a ``system`` message. A load request (empty
  ``messages``) gets only the parameters (``num_ctx`` matters for the load).
* ``/api/generate``: the model's system prompt is used when the request has no ``system``; its messages
  go between the system message and the prompt. ``raw`` requests get only the parameters.
* ``/v1/chat/completions``: sampling fields from the parameters are set only where the body has none
  (``max_tokens`` counts as present when ``max_completion_tokens`` is), the messages and system prompt
  as for ``/api/chat`` (``developer`` counts as a system role).

Pure functions over JSON values; the caller checks :attr:`ModelDefaults.empty` first and leaves a
request for a model without such layers untouched (byte for byte on the OpenAI route).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmman.protocol.ollama.fields import options_to_sampling

__all__ = [
    "ModelDefaults",
    "apply_chat",
    "apply_generate",
    "apply_openai_chat",
    "generate_messages",
    "merge_options",
]

_SYSTEM_ROLES = ("system", "developer")


@dataclass(frozen=True)
class ModelDefaults:
    """A model's request defaults: system prompt ("" for none), Ollama options, seed messages
    (``{"role", "content"}`` objects, Ollama's shape, which is also OpenAI's for plain text)."""

    system: str = ""
    parameters: Mapping[str, object] = field(default_factory=dict)
    messages: Sequence[Mapping[str, object]] = ()

    @property
    def empty(self) -> bool:
        """True when applying these defaults changes nothing."""
        return not (self.system or self.parameters or self.messages)


def merge_options(parameters: Mapping[str, object], options: object) -> object:
    """The request's ``options`` over the model's ``parameters`` (request wins; a null request value
    counts as absent). A non-object ``options`` is returned unchanged, for the request validator to refuse."""
    if options is None:
        return dict(parameters) if parameters else None
    if not isinstance(options, dict):
        return options
    merged = dict(parameters)
    merged.update({k: v for k, v in options.items() if v is not None})
    return merged


def _with_options(body: Mapping[str, object], defaults: ModelDefaults) -> dict[str, object]:
    out = dict(body)
    options = merge_options(defaults.parameters, body.get("options"))
    if options is not None:
        out["options"] = options
    return out


def _first_role(messages: Sequence[object]) -> str:
    first = messages[0] if messages else None
    role = first.get("role") if isinstance(first, Mapping) else None
    return role.lower() if isinstance(role, str) else ""


def _prefix(defaults: ModelDefaults, messages: Sequence[object], system_roles: Sequence[str]) -> list[object]:
    """``[system?] + model messages + messages``; the system prompt only when the first message of the
    request does not have a system role."""
    head: list[object] = [dict(m) for m in defaults.messages]
    if defaults.system and _first_role(messages) not in system_roles:
        head.insert(0, {"role": "system", "content": defaults.system})
    return head + list(messages)


def apply_chat(body: Mapping[str, object], defaults: ModelDefaults) -> dict[str, object]:
    """An Ollama ``/api/chat`` body with the model's defaults applied (rules in the module docstring).
    A ``messages`` value that is not a non-empty list is left for the request validator."""
    out = _with_options(body, defaults)
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        out["messages"] = _prefix(defaults, messages, ("system",))
    return out


def apply_generate(body: Mapping[str, object], defaults: ModelDefaults) -> dict[str, object]:
    """An Ollama ``/api/generate`` body with the model's parameters and, unless ``raw``, its system
    prompt when the body has no ``system``. The model's messages are added by :func:`generate_messages`
    to the built upstream body (``/api/generate`` has no message list of its own)."""
    out = _with_options(body, defaults)
    if body.get("raw") is not True and defaults.system and not body.get("system"):
        out["system"] = defaults.system
    return out


def generate_messages(upstream_messages: Sequence[object], defaults: ModelDefaults) -> list[object]:
    """The model's messages inserted after a leading system message of a built ``/api/generate`` chat
    request (``[system?, user]``), as Ollama renders system, model messages, then the prompt."""
    messages = list(upstream_messages)
    at = 1 if _first_role(messages) == "system" else 0
    return messages[:at] + [dict(m) for m in defaults.messages] + messages[at:]


def apply_openai_chat(body: Mapping[str, object], defaults: ModelDefaults) -> dict[str, object]:
    """An OpenAI ``/v1/chat/completions`` body with the model's defaults where the body has none.

    Raises:
        BadRequest: a stored parameter of the wrong type (not possible for models created by llmman,
            whose parameters were checked at create time).
    """
    out = dict(body)
    for key, value in options_to_sampling(dict(defaults.parameters)).items():
        if key == "max_tokens" and out.get("max_completion_tokens") is not None:
            continue
        if out.get(key) is None:
            out[key] = value
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        out["messages"] = _prefix(defaults, messages, _SYSTEM_ROLES)
    return out

