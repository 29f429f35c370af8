"""What a cold ``llmman run`` waits for, said on the terminal instead of a blank screen.

Before the first token of a model that is not loaded there can be three waits: the model is pulled from
its registry (missing on every node), copied from a peer that stores it (missing here only), and loaded
by llama-server on the node the pool picked. :func:`prepare` pulls a model missing from the whole pool
with the progress bars of ``llmman pull`` (llmman.cli.commands_pull.ProgressView) when both stdout and
stderr are terminals; :class:`Waiting` then draws one spinner line on stderr — ``pulling MODEL…``,
``copying MODEL from NODE… 45 % (41.2 MB / 92.1 MB)``, ``loading MODEL on NODE…`` — from ``/api/ps`` (the
pool's, where a loading model says ``(loading)`` and names its node) and, while the model is fetched, every
node's transfers in progress (``/llmman/devices?pool=1``, their ``/llmman/node`` ``transfers``) until the
first chunk of the answer, and clears it.

Only on a terminal: with stderr not a TTY nothing is drawn and nothing extra is asked of the daemon, so a
piped ``llmman run`` prints the answer and nothing else.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from typing import Any, TextIO

from llmman.cli.client import DaemonClient
from llmman.cli.tables import format_size
from llmman.errors import LlmmanError, ModelNotFound

__all__ = ["Waiting", "canonical", "is_tty", "load", "phase_text", "prepare"]

FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
FRAME_S = 0.1  # spinner frame period
LOOK_EVERY = 4  # frames between two looks at /api/ps
CLEAR = "\r\x1b[K"
LOCAL = "local"  # the node field of this node's entries in a pooled list (cluster/views.py)
LOAD_TIMEOUT_S = 3600.0  # a load's answer may take as long as fetching and loading the model


def is_tty(stream: TextIO) -> bool:
    """True when ``stream`` is a terminal (False for anything that cannot say)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def canonical(model: str, aliases: Mapping[str, str] | None = None) -> str:
    """``model`` as the daemon lists it (``tiny`` -> ``docker.io/ai/tiny:latest``); as given when it does
    not parse."""
    from llmman.refs import parse_reference

    try:
        return str(parse_reference(model, aliases))
    except LlmmanError:
        return model


def _entry(models: list[dict[str, Any]], reference: str) -> dict[str, Any] | None:
    return next((m for m in models if m.get("name") == reference or m.get("model") == reference), None)


def _amount(transfer: dict[str, Any]) -> str:
    """`` 45 % (41.2 MB / 92.1 MB)`` of a transfer entry; empty before its size is known."""
    done, total = transfer.get("completed"), transfer.get("total")
    if not isinstance(done, int) or not isinstance(total, int) or total <= 0:
        return ""
    return f" {min(100, done * 100 // total)} % ({format_size(done)} / {format_size(total)})"


def phase_text(model: str, *, stored_here: bool, source: str | None, loaded: dict[str, Any] | None,
               this_node: str, transfer: dict[str, Any] | None = None) -> str:
    """The spinner's words for what ``model`` waits for (pure): its ``/api/ps`` entry ``loaded`` when
    there is one (loading, or loaded and about to answer), else its ``transfer`` in progress on some node
    (a ``/llmman/node`` ``transfers`` entry, its ``source`` already a node's name where known: copied from
    that peer, or pulled, with how far it is), else the fetch it needs: copied from the node ``source``,
    or pulled when no node stores it."""
    if loaded is None and transfer is not None:
        if transfer.get("kind") == "copy":
            return f"copying {model} from {transfer.get('source') or source}…{_amount(transfer)}"
        return f"pulling {model}…{_amount(transfer)}"
    if loaded is not None:
        node = str(loaded.get("node") or LOCAL)
        where = this_node if node == LOCAL else node
        if "loading" in str(loaded.get("processor", "")):
            return f"loading {model} on {where}…"
        return f"waiting for {model} on {where}…"
    if not stored_here:
        return f"copying {model} from {source}…" if source else f"pulling {model}…"
    return f"loading {model} on {this_node}…"


def prepare(client: DaemonClient, model: str, *, aliases: Mapping[str, str] | None, out: TextIO,
            err: TextIO) -> Waiting | None:
    """On a terminal: pull ``model`` with progress bars when no node of the pool stores it (stdout and
    stderr both terminals), and return the :class:`Waiting` line for the wait that is left; None (and
    no request at all) when stderr is not a terminal.

    Raises:
        LlmmanError: the pull failed (the daemon's words).
    """
    if not is_tty(err):
        return None
    reference = canonical(model, aliases)
    stored_here, source = True, None
    try:
        client.show(model)
    except ModelNotFound:
        stored_here = False
    if not stored_here:
        entry = _entry(client.tags(), reference)  # the pool's list: a peer's entry names its node
        node = str(entry.get("node") or "") if entry is not None else ""
        source = node if node and node != LOCAL else None
        if source is None and is_tty(out):
            _pull(client, reference)
            stored_here = True
    return Waiting(client, model, reference, stored_here=stored_here, source=source, err=err)


def _pull(client: DaemonClient, reference: str) -> None:
    """``POST /api/pull`` drawn as ``llmman pull`` draws it.

    Raises:
        LlmmanError: an in-band error, or a stream that ended without ``success``.
    """
    from llmman.cli.commands_pull import ProgressView

    with ProgressView() as view:
        for line in client.ndjson_stream("/api/pull", {"model": reference, "stream": True}):
            view(line)
    if not view.success:
        raise LlmmanError(f"{reference}: the pull ended without a success status")


def load(client: DaemonClient, model: str, *, keep_alive: str | None) -> None:
    """``POST /api/generate`` with no prompt: load ``model`` (Ollama's way), waiting for it to be ready.

    Raises:
        LlmmanError: the daemon's error (the model cannot be fetched or loaded).
    """
    body: dict[str, Any] = {"model": model}
    if keep_alive is not None:
        body["keep_alive"] = keep_alive
    client._request("POST", "/api/generate", body, timeout=LOAD_TIMEOUT_S)


class Waiting:
    """The spinner line on ``err`` while ``model`` is fetched or loaded; :meth:`stop` clears it (at the
    first chunk of the answer, or when the request ends anyway). A background thread draws it and looks
    at ``/api/ps`` every :data:`LOOK_EVERY` frames; a failing look keeps the last words."""

    def __init__(self, client: DaemonClient, model: str, reference: str, *, stored_here: bool,
                 source: str | None, err: TextIO) -> None:
        self._client = client
        self._model, self._reference = model, reference
        self._stored_here, self._source = stored_here, source
        self._err = err
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._this_node = ""
        self._names: dict[str, str] = {}  # a node's address -> its name
        self._loaded: dict[str, Any] | None = None
        self._transfer: dict[str, Any] | None = None  # the model's transfer on some node, while fetched
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Waiting:
        self._thread = threading.Thread(target=self._run, name="llmman-waiting", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop drawing and clear the line; idempotent."""
        with self._lock:
            if self._thread is None:
                return
            thread, self._thread = self._thread, None
        self._stop.set()
        thread.join()
        with contextlib.suppress(OSError, ValueError):
            self._err.write(CLEAR)
            self._err.flush()

    def _text(self) -> str:
        loaded = self._loaded
        if loaded is not None and loaded.get("node") in self._names:
            loaded = {**loaded, "node": self._names[str(loaded["node"])]}
        source = self._names.get(self._source, self._source) if self._source else None
        transfer = self._transfer
        if transfer is not None and transfer.get("source") in self._names:
            transfer = {**transfer, "source": self._names[str(transfer["source"])]}
        return phase_text(self._model, stored_here=self._stored_here, source=source,
                          loaded=loaded, this_node=self._this_node or "this node", transfer=transfer)

    def _look(self) -> None:
        with contextlib.suppress(LlmmanError, OSError, ValueError):
            if not self._this_node:  # the pool's names: /api/ps names a peer by its address
                nodes = [n for n in self._client.pool().get("nodes") or [] if isinstance(n, dict)]
                self._names = {str(n.get("address")): str(n.get("name")) for n in nodes if n.get("name")}
                me = next((n for n in nodes if n.get("self")), {})
                self._this_node = str(me.get("name") or "")
            self._loaded = _entry(self._client.ps(), self._reference)
            if self._loaded is not None:
                self._stored_here = True
            self._transfer = None if self._stored_here else self._moving()

    def _moving(self) -> dict[str, Any] | None:
        """The model's transfer in progress on any node of the pool (not one that failed), or None."""
        doc = self._client._request("GET", "/llmman/devices?pool=1")
        nodes = doc.get("nodes") if isinstance(doc, dict) else None
        for node in nodes if isinstance(nodes, list) else []:
            for t in node.get("transfers") or [] if isinstance(node, dict) else []:
                if isinstance(t, dict) and t.get("model") == self._reference and not t.get("error"):
                    return t
        return None

    def _run(self) -> None:
        frame = 0
        while not self._stop.is_set():
            if frame % LOOK_EVERY == 0:
                self._look()
            if self._stop.is_set():
                return
            with contextlib.suppress(OSError, ValueError):
                self._err.write(f"{CLEAR}{FRAMES[frame % len(FRAMES)]} {self._text()}")
                self._err.flush()
            frame += 1
            self._stop.wait(FRAME_S)
