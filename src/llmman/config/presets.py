"""Per-model presets: the ``[models."REF"]`` tables of the config file.

A preset sets how one model is started and kept, overriding the ``[server]`` defaults for it::

    [models."docker.io/ai/smollm2:135m"]
    context = 8192          # per-slot context (tokens) when a request sets no num_ctx
    parallel = 2            # llama-server -np
    gpu_layers = 99         # llama-server -ngl
    devices = "0,1"         # CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES / GGML_VK_VISIBLE_DEVICES
    keep_alive = "1h"       # default keep_alive of this model
    preload = true          # loaded when the daemon starts and kept loaded
    extra_args = ["--flash-attn", "on"]   # appended to llama-server's argv

``REF`` is parsed with :func:`llmman.refs.parse_reference` and the preset is keyed by the full reference
(``smollm2:135m`` and ``docker.io/ai/smollm2:135m`` name the same preset): :mod:`.settings` sits in
the layer of :mod:`llmman.refs` and may not import it, so the config keeps the name as written and
:func:`by_reference` (called by the gateway when the daemon starts, before it listens) re-keys the
presets, a bad REF being a config error then. :func:`parse_preset`, :func:`by_reference` and
:func:`device_env` are pure and table-tested (tests/unit/test_presets.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from llmman.durations import format_duration, parse_duration
from llmman.errors import ConfigError, LlmmanError

__all__ = [
    "DEVICE_VARIABLES",
    "PRESET_KEYS",
    "Preset",
    "by_reference",
    "device_env",
    "display_preset",
    "parse_preset",
    "preset_key",
]

MODELS = "models"
# The variables each GPU backend of llama.cpp reads to pick its devices (CUDA, ROCm/HIP, Vulkan).
DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "GGML_VK_VISIBLE_DEVICES")
PRESET_KEYS = ("context", "parallel", "gpu_layers", "devices", "keep_alive", "preload", "extra_args", "split")
SPLITS = ("auto", "always", "never")  # a preset's ``split`` (docs/split.md)


@dataclass(frozen=True)
class Preset:
    """One model's preset; None (or empty) = not set, the ``[server]`` default applies.

    Attributes:
        reference: the model it applies to: as written in the file, the full reference after
            :func:`by_reference` (``docker.io/ai/smollm2:135m``).
        context: per-slot context in tokens when a request sets no ``num_ctx`` (still capped at the model's).
        parallel: request slots (``-np``).
        gpu_layers: ``-ngl`` (-1 = auto, -2 = all, N = N layers).
        devices: GPU ids for the child, e.g. ``"0,1"`` (set in every variable of :data:`DEVICE_VARIABLES`).
        keep_alive: default keep_alive in seconds (``math.inf`` = forever) when a request sets none.
        preload: load the model when the daemon starts and keep it loaded forever.
        extra_args: appended verbatim to llama-server's argv (after llmman's own flags, so they win).
        split: ``auto`` = across nodes only when it fits no single node, ``always`` = across nodes whenever
            peers lend workers, ``never`` = never (docs/split.md); None = ``auto``.
    """

    reference: str
    context: int | None = None
    parallel: int | None = None
    gpu_layers: int | None = None
    devices: str | None = None
    keep_alive: float | None = None
    preload: bool = False
    extra_args: tuple[str, ...] = ()
    split: str | None = None


def preset_key(reference: str) -> str:
    """The dotted key of ``reference``'s preset table: ``models."docker.io/ai/smollm2:135m"``."""
    return f'{MODELS}."{reference}"'


def _int(where: str, raw: object, minimum: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ConfigError(f"{where} must be an integer, got {raw!r}")
    if raw < minimum:
        raise ConfigError(f"{where} must be at least {minimum}, got {raw}")
    return raw


def parse_preset(name: str, table: object) -> Preset:
    """Validate one ``[models."NAME"]`` TOML table.

    Raises:
        ConfigError: the value is not a table, a key is unknown (named), or a value has the wrong type or
            range (naming ``models."REF".key``).
    """
    reference = name.strip()
    if not reference:
        raise ConfigError('[models.""]: a preset needs a model reference')
    if not isinstance(table, Mapping):
        raise ConfigError(f'{preset_key(name)} must be a table ([models."{name}"])')
    values: dict[str, object] = {}
    for key, raw in table.items():
        where = f"{preset_key(name)}.{key}"
        if key == "context":
            values[key] = _int(where, raw, 256)
        elif key == "parallel":
            values[key] = _int(where, raw, 1)
        elif key == "gpu_layers":
            values[key] = _int(where, raw, -2)
        elif key == "devices":
            if not isinstance(raw, str | int) or isinstance(raw, bool) or any(c.isspace() for c in str(raw)):
                raise ConfigError(f'{where} must be a string of device ids like "0,1", got {raw!r}')
            values[key] = str(raw)
        elif key == "keep_alive":
            if isinstance(raw, bool) or not isinstance(raw, str | int | float):
                raise ConfigError(f"{where} must be a duration, got {raw!r}")
            try:
                values[key] = parse_duration(raw, what=where)
            except (ValueError, LlmmanError) as exc:
                raise ConfigError(f"invalid value for {where}: {exc}") from None
        elif key == "preload":
            if not isinstance(raw, bool):
                raise ConfigError(f"{where} must be true or false, got {raw!r}")
            values[key] = raw
        elif key == "extra_args":
            if not isinstance(raw, list) or not all(isinstance(a, str) for a in raw):
                raise ConfigError(f"{where} must be a list of strings, got {raw!r}")
            values[key] = tuple(raw)
        elif key == "split":
            if not isinstance(raw, str) or raw.lower() not in SPLITS:
                raise ConfigError(f"{where} must be one of {', '.join(SPLITS)}, got {raw!r}")
            values[key] = raw.lower()
        else:
            raise ConfigError(f"unknown preset key {where!r} (known: {', '.join(PRESET_KEYS)})")
    return Preset(reference=reference, **values)  # type: ignore[arg-type]


def by_reference(presets: Mapping[str, Preset], parse: Callable[[str], str]) -> dict[str, Preset]:
    """Re-key ``presets`` by full reference, ``parse`` being ``str(refs.parse_reference(name))``.

    Raises:
        ConfigError: a name that is not a model reference, or two names of the same model.
    """
    out: dict[str, Preset] = {}
    for name, preset in presets.items():
        try:
            reference = parse(name)
        except LlmmanError as exc:
            raise ConfigError(f'[models."{name}"]: {exc.message}') from None
        if reference in out:
            raise ConfigError(f'[models."{name}"]: a second preset for {reference}')
        out[reference] = replace(preset, reference=reference)
    return out


def device_env(env: Mapping[str, str], devices: str | None) -> dict[str, str]:
    """``env`` with every :data:`DEVICE_VARIABLES` set to ``devices``; a copy of ``env`` when None."""
    out = dict(env)
    if devices is not None:
        out.update(dict.fromkeys(DEVICE_VARIABLES, devices))
    return out


def display_preset(preset: Preset) -> list[tuple[str, str]]:
    """``(dotted key, value text)`` for each key set in ``preset`` (``llmman config list``)."""
    rows: list[tuple[str, str]] = []
    base = preset_key(preset.reference)
    for key in PRESET_KEYS:
        value = getattr(preset, key)
        if value is None or (key == "extra_args" and not value) or (key == "preload" and not value):
            continue
        if key == "keep_alive":
            text = "forever" if math.isinf(value) else format_duration(value)
        elif key == "extra_args":
            text = " ".join(value)
        elif key == "preload":
            text = "true"
        else:
            text = str(value)
        rows.append((f"{base}.{key}", text))
    return rows
