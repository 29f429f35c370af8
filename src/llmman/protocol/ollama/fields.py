"""Ollama request fields that are not about messages: body, model, ``options``, ``format`` and ``think``.

Pure functions from client JSON to llama-server request fields; every bad input raises
:class:`~llmman.errors.BadRequest` with Ollama-like text (the wording of Ollama's ``server/routes.go``).
The request builders live in :mod:`llmman.protocol.ollama.request`, the stream transducer in
:mod:`llmman.protocol.ollama.stream`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

import orjson

from llmman.errors import BadRequest
from llmman.protocol.limits import check_body_depth

__all__ = [
    "THINK_LEVELS",
    "RunnerOptions",
    "format_to_response_format",
    "options_to_sampling",
    "parse_json_body",
    "require_model",
    "runner_options",
    "think_fields",
    "unknown_options",
    "validate_think",
]

_Kind = Literal["integer", "float", "boolean", "array of strings"]

#: Ollama sampling option -> (llama-server request field, expected type). Source: Ollama ``api.Options``
#: and llama-server's ``/completion`` sampling fields (llama.cpp ``tools/server/README.md``).
_SAMPLING: Final[dict[str, tuple[str, _Kind]]] = {
    "temperature": ("temperature", "float"),
    "top_k": ("top_k", "integer"),
    "top_p": ("top_p", "float"),
    "min_p": ("min_p", "float"),
    "typical_p": ("typical_p", "float"),
    "repeat_penalty": ("repeat_penalty", "float"),
    "repeat_last_n": ("repeat_last_n", "integer"),
    "presence_penalty": ("presence_penalty", "float"),
    "frequency_penalty": ("frequency_penalty", "float"),
    "seed": ("seed", "integer"),
    "stop": ("stop", "array of strings"),
    "num_predict": ("max_tokens", "integer"),
    "mirostat": ("mirostat", "integer"),
    "mirostat_tau": ("mirostat_tau", "float"),
    "mirostat_eta": ("mirostat_eta", "float"),
    "num_keep": ("n_keep", "integer"),
}

#: Load-time options: changing one means restarting the llama-server child (Ollama reloads its runner).
_RUNNER: Final[dict[str, _Kind]] = {
    "num_ctx": "integer",
    "num_batch": "integer",
    "num_gpu": "integer",
    "main_gpu": "integer",
    "num_thread": "integer",
    "use_mmap": "boolean",
    "use_mlock": "boolean",
}

#: Accepted string values of ``think``, besides true and false (Ollama's ``api.ThinkValue``).
THINK_LEVELS: Final = ("low", "medium", "high", "max")


@dataclass(frozen=True)
class RunnerOptions:
    """The runner (load-time) part of Ollama ``options``; None means "not given, use the default"."""

    num_ctx: int | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    num_thread: int | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None


def parse_json_body(raw: bytes) -> dict[str, object]:
    """Parse a request body that must be one JSON object.

    Raises:
        BadRequest: ``missing request body`` for an empty body (Ollama's text), a decoder message for
            invalid JSON or invalid UTF-8, ``request body must be a JSON object`` for arrays and scalars,
            ``body: JSON nested more than 128 levels deep`` (llmman.protocol.limits).
    """
    if not raw.strip():
        raise BadRequest("missing request body")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"invalid JSON in request body: {exc}") from None
    if not isinstance(value, dict):
        raise BadRequest("request body must be a JSON object")
    check_body_depth(value)
    return value


def require_model(body: dict[str, object]) -> str:
    """The ``model`` string of a request, as sent. Raises BadRequest ``model is required`` if missing."""
    model = body.get("model")
    if model is None or model == "":
        raise BadRequest("model is required")
    if not isinstance(model, str):
        raise BadRequest("model must be a string")
    return model


def _options_map(options: object) -> dict[str, object]:
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise BadRequest("options must be an object")
    return options


def _check(key: str, value: object, kind: _Kind) -> object:
    """Validate one option value; integral floats count as integers (JSON has one number type)."""
    ok: bool
    if kind == "integer":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        ok = isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63
    elif kind == "float":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif kind == "boolean":
        ok = isinstance(value, bool)
    else:
        if isinstance(value, str):  # lenient: a single stop string
            value = [value]
        ok = isinstance(value, list) and all(isinstance(s, str) for s in value)
    if not ok:
        if kind == "integer" and isinstance(value, int) and not isinstance(value, bool):
            raise BadRequest(f'option "{key}" is out of range for a 64-bit integer')
        raise BadRequest(f'option "{key}" must be of type {kind}')
    return value


def options_to_sampling(options: object) -> dict[str, object]:
    """Map Ollama ``options`` to llama-server sampling fields (a dict to merge into the request body).

    ``num_predict`` becomes ``max_tokens`` and is omitted when negative (-1 unbounded, -2 fill context);
    ``num_keep`` becomes ``n_keep``; null values are treated as absent. Runner and unknown keys are skipped
    here (see :func:`runner_options`, :func:`unknown_options`).

    Raises:
        BadRequest: ``options must be an object``, or ``option "top_k" must be of type integer`` etc.
            (a bool is never a number).
    """
    out: dict[str, object] = {}
    for key, value in _options_map(options).items():
        spec = _SAMPLING.get(key)
        if spec is None or value is None:
            continue
        field, kind = spec
        checked = _check(key, value, kind)
        if key == "num_predict" and isinstance(checked, int) and checked < 0:
            continue
        out[field] = checked
    return out


def runner_options(options: object) -> RunnerOptions:
    """The load-time keys of Ollama ``options`` (num_ctx, num_batch, num_gpu, main_gpu, num_thread, use_mmap,
    use_mlock). ``num_gpu`` -1 and ``num_thread`` 0 mean "automatic", i.e. not given (None).

    Raises:
        BadRequest: a wrong type, like :func:`options_to_sampling`; a value llama-server cannot take:
            ``option "num_batch" must be at least 1, got 0`` (also num_gpu below -1, main_gpu below 0,
            num_thread below 0 or above :data:`MAX_THREADS`).
    """
    values = {
        key: _check(key, value, _RUNNER[key])
        for key, value in _options_map(options).items()
        if key in _RUNNER and value is not None
    }

    def num(key: str) -> int | None:
        value = values.get(key)
        if key in _AUTO_WHEN and value == _AUTO_WHEN[key]:
            return None  # Ollama's "let it decide": the same as not given
        return value if isinstance(value, int) else None

    def flag(key: str) -> bool | None:
        value = values.get(key)
        return value if isinstance(value, bool) else None

    _check_ranges(values)
    return RunnerOptions(
        num_ctx=num("num_ctx"),
        num_batch=num("num_batch"),
        num_gpu=num("num_gpu"),
        main_gpu=num("main_gpu"),
        num_thread=num("num_thread"),
        use_mmap=flag("use_mmap"),
        use_mlock=flag("use_mlock"),
    )


#: Values that mean "the default" (as if not given): num_gpu -1 (Ollama's auto; it never reloads for it,
#: server/sched.go needsReload), num_thread 0 (Ollama's "let the runner pick").
_AUTO_WHEN: Final[dict[str, int]] = {"num_gpu": -1, "num_thread": 0}

#: The least value of each numeric load option (after the "auto" values above).
_LEAST: Final[dict[str, tuple[int, str]]] = {
    "num_batch": (1, "at least 1"),
    "num_gpu": (0, "-1 (automatic) or at least 0"),
    "main_gpu": (0, "at least 0"),
    "num_thread": (0, "0 (automatic) or at least 1"),
}


#: The most threads a llama-server child may be asked for: ggml's ``GGML_MAX_N_THREADS``. Far more (e.g.
#: 100 000) kills the child with a segmentation fault while it loads, and that failure would hold the model
#: back (the scheduler's retry pause) for every other client too.
MAX_THREADS: Final = 512


def _check_ranges(values: dict[str, object]) -> None:
    """Refuse load options llama-server cannot take (a negative batch, GPU or thread count; more threads
    than :data:`MAX_THREADS`)."""
    for key, (least, words) in _LEAST.items():
        value = values.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value != _AUTO_WHEN.get(key) \
                and value < least:
            raise BadRequest(f'option "{key}" must be {words}, got {value}')
    threads = values.get("num_thread")
    if isinstance(threads, int) and threads > MAX_THREADS:
        raise BadRequest(f'option "num_thread" must be at most {MAX_THREADS}, got {threads}')


def unknown_options(options: object) -> tuple[str, ...]:
    """Keys of ``options`` llmman does not use (e.g. legacy ``tfs_z``, ``numa``): the caller logs a warning.

    Ollama ignores unknown keys with a warning; its Python client still sends removed ones.
    """
    return tuple(k for k in _options_map(options) if k not in _SAMPLING and k not in _RUNNER)


def format_to_response_format(fmt: object) -> dict[str, object] | None:
    """Map Ollama ``format`` to the OpenAI-style ``response_format`` of llama-server's chat route.

    ``"json"`` -> ``{"type": "json_object"}``; a JSON-schema object -> ``{"type": "json_schema",
    "json_schema": {"name": "schema", "schema": fmt}}``; ``""``/None -> None.

    Raises:
        BadRequest: any other value.
    """
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "schema", "schema": fmt}}
    raise BadRequest(
        f'invalid format: expected "json" or a valid JSON schema, got {orjson.dumps(fmt).decode()}'
    )


def validate_think(think: object) -> bool | str | None:
    """Check Ollama ``think``: true, false, one of ``low|medium|high|max``, or absent (None).

    Raises:
        BadRequest: ``invalid think value: ...`` for anything else (Ollama answers 400 too).
    """
    if think is None or isinstance(think, bool):
        return think
    if isinstance(think, str) and think in THINK_LEVELS:
        return think
    raise BadRequest(
        f"invalid think value: {orjson.dumps(think).decode()} "
        '(must be true, false, "low", "medium", "high" or "max")'
    )


def think_fields(think: bool | str | None) -> dict[str, object]:
    """llama-server chat fields (``chat_template_kwargs``, ``reasoning_effort``) for a validated ``think``.

    - None: nothing (the model's template default). The routes first apply Ollama's default, which turns
      thinking on for a model with the ``thinking`` capability
      (:func:`llmman.protocol.ollama_request.with_default_think`), so None reaches here only for models
      that cannot think.
    - False: ``chat_template_kwargs.enable_thinking = false`` (Qwen-style templates) and
      ``reasoning_effort = "none"``, which llama-server documents as disabling thinking.
    - True: ``chat_template_kwargs.enable_thinking = true``.
    - A level: as True, plus ``chat_template_kwargs.reasoning_effort`` = the level (gpt-oss-style templates
      read it; ``max`` is sent as ``high``, the highest level such templates know). The top-level
      ``reasoning_effort`` is not sent for levels: its accepted values are not documented for this build.
    """
    if think is None:
        return {}
    if think is False:
        return {"chat_template_kwargs": {"enable_thinking": False}, "reasoning_effort": "none"}
    kwargs: dict[str, object] = {"enable_thinking": True}
    if isinstance(think, str):
        kwargs["reasoning_effort"] = "high" if think == "max" else think
    return {"chat_template_kwargs": kwargs}
