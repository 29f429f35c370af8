"""A fault-injecting peer for pool tests: an HTTP server that is no llmman, whose ``/llmman/node`` answer
a test sets (any bytes, after any delay) and whose POST routes all answer 503 (or, with ``hang``, nothing).

Named as what it is: a stand-in for a hostile or broken peer (tests/faults/test_pool_*.py), never for a
working node (real daemons play those).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def document(**extra: Any) -> bytes:
    """A valid node document (memory, nothing loaded or stored, name ``evil``) with ``extra`` merged."""
    doc: dict[str, Any] = {"memory": 8 * 10**9, "loaded": {}, "stored": {}, "name": "evil", "version": "9"}
    doc.update(extra)
    return json.dumps(doc).encode()


@dataclass
class EvilPeer:
    """The fault-injecting peer: ``body`` is what its ``/llmman/node`` answers (200) now; ``asked``
    counts the fetches, so a test can wait for the daemon to have read the new body."""

    body: bytes = field(default_factory=document)
    asked: int = 0
    delay: float = 0.0  # seconds its /llmman/node waits before answering
    posts: list[str] = field(default_factory=list)  # the paths POSTed to it, in order
    hang: bool = False  # a POST gets no answer at all until ``release`` is set (a stalled request)
    head: bytes = b""  # with ``hang``: first send a 200 and these bytes (an NDJSON line), then stall
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def set(self, body: bytes) -> int:
        with self.lock:
            self.body = body
            return self.asked

    def handler(self) -> type[BaseHTTPRequestHandler]:
        peer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                with peer.lock:
                    body = peer.body if self.path == "/llmman/node" else b"{}"
                    peer.asked += self.path == "/llmman/node"
                    delay = peer.delay
                time.sleep(delay)  # a slow peer, not synchronisation
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:
                    pass  # the daemon gave up on it (too big): what this peer is for

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with peer.lock:
                    peer.posts.append(self.path)
                if peer.hang:
                    if peer.head:
                        self.send_response(200)
                        self.send_header("Content-Type", "application/x-ndjson")
                        self.send_header("Transfer-Encoding", "chunked")
                        self.end_headers()
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(peer.head), peer.head))
                        self.wfile.flush()
                    peer.release.wait()
                    return
                body = b'{"error": "the evil peer serves nothing"}'
                self.send_response(503)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler


def serve_peer(peer: EvilPeer, host: str, port: int) -> ThreadingHTTPServer:
    """``peer`` listening on ``host:port`` in a daemon thread; the caller shuts the server down."""
    server = ThreadingHTTPServer((host, port), peer.handler())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
