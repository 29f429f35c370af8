"""Pure formatters for the CLI's tables: sizes, relative times, PROCESSOR, and column layout.

Everything here is a function of its arguments (``now`` is passed in), so it is table-tested. The
shapes follow Ollama's CLI (``cmd/cmd.go``, ``format/``) with llmman's columns:

* ``ps``: NAME ID SIZE PROCESSOR CONTEXT STARTED [NODE] UNTIL — NODE only when an entry has one (or is
  split over nodes: :func:`node_cell`).
* ``list``: NAME ID SIZE MODIFIED.
* ``nodes``: NODE ADDRESS STATE MEMORY MODELS LAST SEEN (``/llmman/pool``).
* ``run --verbose``: the timings of the final ``done`` line, as Ollama's ``api.Metrics.Summary`` prints them
  (:func:`format_metrics`, durations in Go's notation: :func:`go_duration`).

Columns are left-aligned and separated by four spaces; the header is always printed; trailing spaces
are trimmed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "format_ago",
    "format_metrics",
    "format_show",
    "format_size",
    "format_until",
    "go_duration",
    "list_table",
    "nodes_table",
    "processor",
    "ps_table",
    "render_table",
    "short_id",
    "to_datetime",
]

GAP = "    "
_MINUTE = 60
_HOUR = 3600
_DAY = 86400
# Ollama shows "Forever" for an expiry more than 20 years ahead (its "forever" is ~292 years ahead).
_FOREVER_AFTER = 20 * 365 * _DAY


def format_size(size: int | float) -> str:
    """Bytes in decimal units with one decimal: ``999 B``, ``1.5 kB``, ``98.3 MB``, ``1.2 GB``, ``2.0 TB``."""
    n = max(0, int(size))
    for unit, factor in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= factor:
            return f"{n / factor:.1f} {unit}"
    return f"{n} B"


def short_id(digest: str) -> str:
    """The first 12 hex digits of a digest, with or without its ``sha256:`` prefix."""
    return digest.split(":", 1)[-1][:12]


def to_datetime(value: object) -> datetime | None:
    """An aware datetime from an RFC 3339 string, unix seconds, or a datetime; None if unusable."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            return datetime.fromtimestamp(value, tz=UTC)
        except (OverflowError, OSError, ValueError):
            return None
    if isinstance(value, str) and value:
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None


def _plural(n: int, unit: str) -> str:
    return f"{n} {unit}" if n == 1 else f"{n} {unit}s"


def _span(seconds: float) -> str:
    """``seconds >= 60`` as ``N minutes`` / ``N hours`` / ``N days`` / ``N weeks`` / ``N months`` /
    ``N years`` (30-day months, 365-day years), singular for one."""
    s = int(seconds)
    if s < _HOUR:
        return _plural(s // _MINUTE, "minute")
    if s < _DAY:
        return _plural(s // _HOUR, "hour")
    if s < 7 * _DAY:
        return _plural(s // _DAY, "day")
    if s < 30 * _DAY:
        return _plural(s // (7 * _DAY), "week")
    if s < 365 * _DAY:
        return _plural(s // (30 * _DAY), "month")
    return _plural(s // (365 * _DAY), "year")


def format_ago(value: object, now: datetime) -> str:
    """A past time relative to ``now``: ``just now`` (< 60 s), ``1 minute ago``, ``5 minutes ago``,
    ``3 hours ago``, ``yesterday`` (24–48 h), ``4 days ago``, ``2 weeks ago``, ``1 month ago``...

    A time in the future counts as now; an unparseable one is ``unknown``.
    """
    when = to_datetime(value)
    if when is None:
        return "unknown"
    seconds = max(0.0, (now - when).total_seconds())
    if seconds < _MINUTE:
        return "just now"
    if _DAY <= seconds < 2 * _DAY:
        return "yesterday"
    return f"{_span(seconds)} ago"


def format_until(value: object, now: datetime) -> str:
    """An expiry relative to ``now``, as ``ollama ps`` UNTIL shows it.

    ``Forever`` when missing or more than 20 years ahead; ``Stopping...`` when not in the future;
    ``less than a minute from now``; else ``1 minute from now``, ``4 minutes from now``, ``2 hours from
    now``, ``3 days from now``... Unparseable text is ``unknown``.
    """
    if value is None or value == "":
        return "Forever"
    when = to_datetime(value)
    if when is None:
        return "unknown"
    seconds = (when - now).total_seconds()
    if seconds > _FOREVER_AFTER:
        return "Forever"
    if seconds <= 0:
        return "Stopping..."
    if seconds < _MINUTE:
        return "less than a minute from now"
    return f"{_span(seconds)} from now"


def processor(entry: Mapping[str, Any]) -> str:
    """The PROCESSOR cell: the entry's ``processor`` field when present, as llmman has always shown it
    (``llama-server``, ``llama-server (loading)``, ``failed (out of memory)``; docs/memory.md),
    else, for an entry without one, Ollama's split of ``size_vram`` over
    ``size`` (``cmd/cmd.go`` ListRunningHandler): ``100% CPU``, ``100% GPU``, ``48%/52% CPU/GPU`` (CPU
    share rounded), ``Unknown`` (more VRAM than size)."""
    named = entry.get("processor")
    if isinstance(named, str) and named:
        return named
    size = int(entry.get("size") or 0)
    vram = int(entry.get("size_vram") or 0)
    if vram > size:
        return "Unknown"
    if vram == 0:
        return "100% CPU"
    if vram == size:
        return "100% GPU"
    cpu = round((size - vram) / size * 100)
    return f"{cpu}%/{100 - cpu}% CPU/GPU"


def printable(text: str) -> str:
    """``text`` with every control character (C0, DEL, C1: a newline, an ANSI escape) written as ``\\xNN``:
    what a daemon or a peer reports (a node's name, a model's) cannot move the cursor or rewrite the
    terminal."""
    return "".join(f"\\x{ord(c):02x}" if ord(c) < 32 or 127 <= ord(c) < 160 else c for c in text)


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns, four spaces apart, header first, trailing spaces trimmed; ends in a newline.
    Cells are :func:`printable`."""
    widths = [len(h) for h in headers]
    rows = [[printable(cell) for cell in row] for row in rows]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in [list(headers), *rows]:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append(GAP.join(cells).rstrip())
    return "\n".join(lines) + "\n"


def node_cell(entry: Mapping[str, Any]) -> str:
    """``ps``'s NODE cell: the entry's ``node``; for a model split over nodes (``split``, docs/split.md),
    every node's size after it, the node running llama-server first: ``alpha 197.4 MB + 10.0.0.3:17434
    88.0 MB``."""
    split = entry.get("split")
    node = str(entry.get("node") or "")
    if not isinstance(split, list) or not split:
        return node
    parts = [f"{part.get('node') or ''} {format_size(part.get('size') or 0)}"
             for part in split if isinstance(part, Mapping)]
    return (f"{node}: " if node else "") + " + ".join(parts)


def ps_table(models: Sequence[Mapping[str, Any]], now: datetime) -> str:
    """The ``llmman ps`` table from ``/api/ps`` entries, in the daemon's order. UNTIL is empty for an
    entry whose PROCESSOR is ``failed (...)`` (a load that failed keeps no expiry worth showing)."""
    with_node = any(m.get("node") or m.get("split") for m in models)
    headers = ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "STARTED"]
    if with_node:
        headers.append("NODE")
    headers.append("UNTIL")
    rows = []
    for m in models:
        context = m.get("context_length")
        started = m.get("started_at")
        row = [
            str(m.get("name") or m.get("model") or ""),
            short_id(str(m.get("digest") or "")),
            format_size(m.get("size") or 0),
            processor(m),
            str(context) if context else "",
            format_ago(started, now) if started else "",
        ]
        if with_node:
            row.append(node_cell(m))
        # a failed load has no expiry to show: its entry stays until the next request, never "Stopping..."
        row.append("" if row[3].startswith("failed") else format_until(m.get("expires_at"), now))
        rows.append(row)
    return render_table(headers, rows)


def list_table(models: Sequence[Mapping[str, Any]], now: datetime) -> str:
    """The ``llmman list`` table from ``/api/tags``-shaped entries (``name``, ``digest``, ``size``,
    ``modified_at`` as RFC 3339 or unix seconds)."""
    rows = [
        [
            str(m.get("name") or m.get("model") or ""),
            short_id(str(m.get("digest") or "")),
            format_size(m.get("size") or 0),
            format_ago(m.get("modified_at"), now),
        ]
        for m in models
    ]
    return render_table(["NAME", "ID", "SIZE", "MODIFIED"], rows)


def _seen(value: object) -> str:
    """LAST SEEN: ``now`` under a second, ``4s ago``, ``3 minutes ago``; ``never`` without a time."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "never"
    if value < 1:
        return "now"
    if value < _MINUTE:
        return f"{int(value)}s ago"
    return f"{_span(value)} ago"


def _lent_cell(rpc: object) -> str:
    """The RPC workers a node lends to peers' splits (``/llmman/pool``'s ``rpc``), for MODELS: ``RPC worker
    for a split 100.9 MB`` (``2 RPC workers …``); empty when it lends none."""
    if not isinstance(rpc, Mapping):
        return ""
    workers, reserved = rpc.get("workers"), rpc.get("reserved")
    if not isinstance(workers, int) or isinstance(workers, bool) or workers <= 0:
        return ""
    size = format_size(reserved) if isinstance(reserved, int) and not isinstance(reserved, bool) else "?"
    return f"{workers} RPC worker{'s' if workers > 1 else ''} for a split {size}"


def _models_cell(models: object) -> str:
    """MODELS: ``REF in_flight/slots[, N queued][, loading][, draining]`` per loaded model, ``; `` between."""
    if not isinstance(models, Mapping):
        return ""
    cells = []
    for ref, m in models.items():
        if not isinstance(m, Mapping):
            continue
        slots = m.get("slots") or "?"
        parts = [f"{ref} {m.get('in_flight') or 0}/{slots}"]
        if m.get("queued"):
            parts.append(f"{m['queued']} queued")
        parts += [flag for flag in ("loading", "draining") if m.get(flag) is True]
        cells.append(", ".join(parts))
    return "; ".join(cells)


def nodes_table(nodes: Sequence[Mapping[str, Any]]) -> str:
    """The ``llmman nodes`` table from ``/llmman/pool`` entries, in the daemon's order (this node first,
    its NODE marked ``(this node)``). STATE is ``up``, ``draining`` or ``down: why``, with ``, fallback``
    for a fallback-only node; MEMORY is used/total (``unknown`` when the node does not know its total)."""
    rows = []
    for n in nodes:
        name = str(n.get("name") or "") or "?"
        state = str(n.get("state") or "")
        if state == "down" and n.get("why"):
            state = f"down: {_short(n['why'], 40)}"
        if n.get("fallback") is True:
            state += ", fallback"
        memory, free = n.get("memory") or 0, n.get("free") or 0
        if n.get("state") == "down":
            used = ""
        elif memory:
            used = f"{format_size(memory - free)}/{format_size(memory)}"
        else:
            used = "unknown"
        rows.append([
            f"{name} (this node)" if n.get("self") is True else name,
            str(n.get("address") or ""),
            state,
            used,
            "; ".join(c for c in (_models_cell(n.get("models")), _lent_cell(n.get("rpc"))) if c),
            _seen(n.get("last_seen")),
        ])
    return render_table(["NODE", "ADDRESS", "STATE", "MEMORY", "MODELS", "LAST SEEN"], rows)


def _section(title: str, pairs: Sequence[tuple[str, str]], width: int = 20) -> list[str]:
    lines = [f"  {title}"]
    for key, value in pairs:
        lines.append(f"    {key.ljust(width)}{value}".rstrip() if value else f"    {key}")
    return [*lines, ""]


def format_show(data: Mapping[str, Any], *, verbose: bool = False) -> str:
    """The ``llmman show`` summary from an ``/api/show`` answer, laid out like ``ollama show``:
    Model (architecture, parameters, context length, embedding length, quantization), Capabilities,
    Parameters, System and License (first lines), and with ``verbose`` every ``model_info`` key as
    Metadata."""
    details: Mapping[str, Any] = data.get("details") or {}
    info: Mapping[str, Any] = data.get("model_info") or {}
    arch = str(info.get("general.architecture") or details.get("family") or "")
    model = [
        ("architecture", arch),
        ("parameters", str(details.get("parameter_size") or "")),
        ("context length", str(info.get(f"{arch}.context_length") or "")),
        ("embedding length", str(info.get(f"{arch}.embedding_length") or "")),
        ("quantization", str(details.get("quantization_level") or "")),
    ]
    lines = _section("Model", [(k, v) for k, v in model if v])
    capabilities = [str(c) for c in data.get("capabilities") or []]
    if capabilities:
        lines += _section("Capabilities", [(c, "") for c in capabilities])
    params = [p.split(None, 1) for p in str(data.get("parameters") or "").splitlines() if p.strip()]
    if params:
        width = max(len(p[0]) for p in params) + 4
        lines += _section("Parameters", [(p[0], p[1] if len(p) > 1 else "") for p in params], width)
    system_lines = [line.strip() for line in str(data.get("system") or "").splitlines() if line.strip()]
    if system_lines:  # a derived model's system prompt (first lines), as ``ollama show`` prints it
        shown = system_lines[:2] + (["..."] if len(system_lines) > 2 else [])
        lines += _section("System", [(line, "") for line in shown])
    license_lines = [line.strip() for line in str(data.get("license") or "").splitlines() if line.strip()]
    if license_lines:
        shown = license_lines[:2] + (["..."] if len(license_lines) > 2 else [])
        lines += _section("License", [(line, "") for line in shown])
    if verbose and info:
        width = max(len(k) for k in info) + 4
        lines += _section("Metadata", [(k, _short(info[k])) for k in sorted(info)], width)
    return "\n".join(lines)


def _short(value: object, limit: int = 80) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _decimal(n: int, unit: int) -> str:
    """``n / unit`` with the fraction's trailing zeros dropped (``1500, 1000`` -> ``1.5``)."""
    whole, rest = divmod(n, unit)
    if not rest:
        return str(whole)
    digits = str(rest).rjust(len(str(unit)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"


def go_duration(ns: int) -> str:
    """Nanoseconds as Go's ``time.Duration`` prints them: ``0s``, ``850ns``, ``1.5µs``, ``30.291ms``,
    ``1.560291s``, ``2m3.5s``, ``1h0m0s``."""
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    if ns == 0:
        return "0s"
    if ns < 1000:
        return f"{sign}{ns}ns"
    if ns < 10**6:
        return f"{sign}{_decimal(ns, 1000)}µs"
    if ns < 10**9:
        return f"{sign}{_decimal(ns, 10**6)}ms"
    hours, rest = divmod(ns, 3600 * 10**9)
    minutes, rest = divmod(rest, 60 * 10**9)
    head = f"{hours}h{minutes}m" if hours else f"{minutes}m" if minutes else ""
    return f"{sign}{head}{_decimal(rest, 10**9)}s"


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def format_metrics(final: Mapping[str, Any]) -> str:
    """``run --verbose``'s lines from a final ``done`` chunk (``total_duration``, ``load_duration``,
    ``prompt_eval_count``/``_duration``, ``eval_count``/``_duration``, in ns), as Ollama prints them: a
    line only for a figure above zero, a rate with each duration; ends in a newline ("" when none)."""
    total, load = _count(final.get("total_duration")), _count(final.get("load_duration"))
    prompt_n, prompt_ns = _count(final.get("prompt_eval_count")), _count(final.get("prompt_eval_duration"))
    eval_n, eval_ns = _count(final.get("eval_count")), _count(final.get("eval_duration"))
    lines = []
    if total:
        lines.append(f"total duration:       {go_duration(total)}")
    if load:
        lines.append(f"load duration:        {go_duration(load)}")
    if prompt_n:
        lines.append(f"prompt eval count:    {prompt_n} token(s)")
    if prompt_ns:
        lines.append(f"prompt eval duration: {go_duration(prompt_ns)}")
        lines.append(f"prompt eval rate:     {prompt_n / (prompt_ns / 1e9):.2f} tokens/s")
    if eval_n:
        lines.append(f"eval count:           {eval_n} token(s)")
    if eval_ns:
        lines.append(f"eval duration:        {go_duration(eval_ns)}")
        lines.append(f"eval rate:            {eval_n / (eval_ns / 1e9):.2f} tokens/s")
    return "".join(line + "\n" for line in lines)
