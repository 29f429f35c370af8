"""Blob bodies served by ``sendfile(2)`` from threads, off the event loop that relays inference.

``GET /v2/<name>/blobs/<digest>`` (:mod:`llmman.api.v2`) answers a large blob with ``307`` to this
server's own port on the same host (``/blobs/<digest>?e=<expiry>&s=<signature>``), as registries do
with object storage (OCI distribution-spec 1.1, "Pulling blobs"). The signature is an HMAC-SHA256
over the digest and the expiry (unix seconds, :data:`TTL_S` ahead) with a key made when the server
starts, so the URL is good for that one blob, for a short while, from this process only: the API keys
stay required at the front door (``/v2/``), and the blob server itself checks nothing else.

The server is started on the first redirect (:func:`blob_server`), listens on the daemon's bind
host at a port the OS picks, and answers each connection in its own thread (at most
:data:`MAX_CONNECTIONS` at once, 503 past that; each request head, the TLS handshake with the first,
must arrive whole within :data:`HEAD_TIMEOUT_S`, so slow clients cannot hold the slots): ``GET`` and
``HEAD``, HTTP/1.1 keep-alive, one
``Range`` (RFC 9110 §14, parsed by :mod:`llmman.api.byteranges`; several ranges are answered with the
whole blob, which RFC 9110 allows). Over plain HTTP the body goes by ``socket.sendfile`` (the kernel
copies page cache to socket and the GIL is released); when the daemon serves TLS this server does too,
with the same certificate, and the body is read and encrypted in 1 MiB blocks in the thread (OpenSSL
releases the GIL too; there is no kernel TLS in Python's ``ssl``).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import ssl
import threading
import time
import weakref
from typing import BinaryIO
from urllib.parse import parse_qs, urlsplit

from llmman.api.byteranges import decide
from llmman.errors import StoreError
from llmman.store import Store

log = logging.getLogger("llmman.api")

TTL_S = 60  # how long a signed URL may be used to start a transfer (a transfer under way goes on)
MAX_CONNECTIONS = 64
IO_TIMEOUT_S = 60.0  # a connection that moves nothing for this long is closed
HEAD_TIMEOUT_S = 10.0  # the same while waiting for a request (the next one on a kept-alive connection too)
HEAD_LIMIT = 16384  # request line plus headers
TLS_BLOCK = 1 << 20
API_HEADER = "Docker-Distribution-Api-Version: registry/2.0\r\n"


class BlobServer:
    """The listening socket, the signing key and one thread per connection; :meth:`close` stops it.

    Args:
        store: where the blobs are (``blobs/sha256/<hex>``).
        host: the address to bind (the daemon's ``server.host``; ``""``, ``0.0.0.0`` and ``::`` are
            every address).
        tls: the server context when the daemon serves TLS, else None.
    """

    def __init__(self, store: Store, host: str, tls: ssl.SSLContext | None = None, port: int = 0) -> None:
        self.store, self.tls = store, tls
        self._key = secrets.token_bytes(32)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, port), family=family, backlog=128,
                                              dualstack_ipv6=host == "::" and socket.has_dualstack_ipv6())
        self.port: int = self._listener.getsockname()[1]
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._closed = False
        threading.Thread(target=self._accept, name="llmman-blobs", daemon=True).start()

    # -- signed URLs -----------------------------------------------------------------------------
    def _mac(self, digest: str, expiry: int) -> str:
        return hmac.new(self._key, f"{digest}\n{expiry}".encode(), hashlib.sha256).hexdigest()

    def signed_path(self, digest: str) -> str:
        """``/blobs/<digest>?e=&s=``: the path and query that fetch ``digest`` for :data:`TTL_S` s."""
        expiry = int(time.time()) + TTL_S
        return f"/blobs/{digest}?e={expiry}&s={self._mac(digest, expiry)}"

    def allows(self, digest: str, expiry: str, signature: str) -> bool:
        """True when ``signature`` is this server's for ``digest`` and ``expiry`` has not passed."""
        if not expiry.isdigit() or len(expiry) > 12 or int(expiry) < time.time():
            return False
        return hmac.compare_digest(self._mac(digest, int(expiry)), signature)

    # -- serving ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop accepting (connections being answered finish)."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                if self._closed:
                    return
                continue
            if not self._slots.acquire(blocking=False):
                with contextlib.suppress(OSError):
                    conn.sendall(_head(503, "Service Unavailable", 0,
                                       "Retry-After: 1\r\nConnection: close\r\n"))
                conn.close()
                continue
            threading.Thread(target=self._connection, args=(conn,), name="llmman-blob", daemon=True).start()

    def _connection(self, raw: socket.socket) -> None:
        sock: socket.socket = raw
        try:
            sock.settimeout(HEAD_TIMEOUT_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with _Deadline(sock, HEAD_TIMEOUT_S) as deadline:  # the TLS handshake and the first head
                if self.tls is not None:
                    sock = deadline.sock = self.tls.wrap_socket(raw, server_side=True,
                                                                do_handshake_on_connect=False)
                    sock.do_handshake()
                with sock.makefile("rb") as reader:
                    while True:
                        sock.settimeout(HEAD_TIMEOUT_S)  # an idle or slow client gives its slot back soon
                        deadline.arm(HEAD_TIMEOUT_S)
                        req = _Request.read(reader)
                        if not deadline.disarm() or req is None:
                            break
                        sock.settimeout(IO_TIMEOUT_S)
                        if not self._answer(sock, req):
                            break
        except (OSError, ValueError) as exc:
            log.debug("blob connection ended: %s", exc)
        finally:
            with contextlib.suppress(OSError):
                sock.close()
            self._slots.release()

    def _answer(self, sock: socket.socket, req: _Request) -> bool:
        """Answer ``req``; True to read another request on this connection."""
        keep = req.keep_alive
        conn = "" if keep else "Connection: close\r\n"
        if req.method not in ("GET", "HEAD"):
            _error(sock, 405, "Method Not Allowed", "UNSUPPORTED", "only GET and HEAD", conn)
            return keep
        parts = urlsplit(req.target)
        query = parse_qs(parts.query)
        digest = parts.path.removeprefix("/blobs/")
        if not parts.path.startswith("/blobs/") or not self.allows(digest, query.get("e", [""])[0],
                                                                   query.get("s", [""])[0]):
            _error(sock, 403, "Forbidden", "DENIED", "the blob URL is not signed or has expired; "
                   "ask /v2/<name>/blobs/<digest> again", conn)
            return keep
        try:
            f = open(self.store.blob_path(digest), "rb")  # closed by the with below
        except (StoreError, OSError):
            _error(sock, 404, "Not Found", "BLOB_UNKNOWN", f"blob {digest} not found", conn)
            return keep
        with f:
            size = os.fstat(f.fileno()).st_size
            decision = decide(req.range, size)
            extra = f"Docker-Content-Digest: {digest}\r\nAccept-Ranges: bytes\r\n{conn}"
            if decision.unsatisfiable:
                _error(sock, 416, "Range Not Satisfiable", "RANGE_INVALID", f"range {req.range} not "
                       f"satisfiable for {size} bytes", f"Content-Range: bytes */{size}\r\n{extra}")
                return keep
            if decision.ranges and len(decision.ranges) == 1:
                first, last = decision.ranges[0]
                status, reason = 206, "Partial Content"
                extra += f"Content-Range: bytes {first}-{last}/{size}\r\n"
            else:
                first, last, status, reason = 0, size - 1, 200, "OK"
            count = last - first + 1
            sock.sendall(_head(status, reason, count, extra, "application/octet-stream"))
            if req.method == "GET" and count:
                sent = self._send_body(sock, f, first, count)
                log.info("blob server: sent %s bytes %d-%d (%d bytes) to %s over %s", digest, first,
                         first + sent - 1, sent, _peer(sock), "sendfile" if self.tls is None else "TLS")
                if sent != count:  # the file shrank under us: the client sees a short body
                    return False
        return keep

    def _send_body(self, sock: socket.socket, f: BinaryIO, offset: int, count: int) -> int:
        if self.tls is None:
            return sock.sendfile(f, offset, count)
        f.seek(offset)
        buf = memoryview(bytearray(min(TLS_BLOCK, count)))
        sent = 0
        while sent < count:
            n = f.readinto(buf[: min(len(buf), count - sent)])  # type: ignore[attr-defined]
            if not n:
                break
            sock.sendall(buf[:n])
            sent += n
        return sent


class _Deadline:
    """The whole time a client has to send a request head (and, for the first, the TLS handshake).

    A socket timeout bounds each read only: a client dripping a byte just inside it (slowloris) would keep
    its slot for ever. Past the deadline a timer thread shuts the socket down, which ends the read under
    way; :meth:`disarm` then says the head came too late.
    """

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self.sock = sock  # the socket to shut down (the TLS one once wrapped)
        self._timer: threading.Timer | None = None
        self._expired = threading.Event()
        self.arm(seconds)

    def arm(self, seconds: float) -> None:
        """(Re)start the deadline ``seconds`` from now."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> bool:
        """Stop the deadline; False when it had passed (the connection is to be closed)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return not self._expired.is_set()

    def _expire(self) -> None:
        self._expired.set()
        with contextlib.suppress(OSError):  # the socket layer's shutdown, under TLS too (not SSLSocket's)
            socket.socket.shutdown(self.sock, socket.SHUT_RDWR)

    def __enter__(self) -> _Deadline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.disarm()


class _Request:
    """One request's line and the headers this server reads (``Range``, ``Connection``)."""

    def __init__(self, method: str, target: str, version: str, headers: dict[str, str]) -> None:
        self.method, self.target = method, target
        self.range = headers.get("range")
        connection = headers.get("connection", "").lower()
        self.keep_alive = ("close" not in connection if version == "HTTP/1.1"
                           else "keep-alive" in connection)

    @classmethod
    def read(cls, reader: BinaryIO) -> _Request | None:
        """Read a request head from ``reader``; None at the end of the connection. Raises ValueError
        when it is not HTTP/1.x or too long."""
        line = reader.readline(HEAD_LIMIT)
        if not line:
            return None
        try:
            method, target, version = line.decode("latin-1").split()
        except ValueError:
            raise ValueError("bad request line") from None
        if not version.startswith("HTTP/1."):
            raise ValueError("not HTTP/1.x")
        headers: dict[str, str] = {}
        total = len(line)
        while (line := reader.readline(HEAD_LIMIT)) not in (b"\r\n", b"\n", b""):
            total += len(line)
            if total > HEAD_LIMIT:
                raise ValueError("request head too long")
            name, sep, value = line.decode("latin-1").partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        return cls(method, target, version, headers)


def _peer(sock: socket.socket) -> str:
    try:
        return str(sock.getpeername()[0])
    except OSError:
        return "a closed connection"


def _head(status: int, reason: str, length: int, extra: str = "", media: str = "") -> bytes:
    kind = f"Content-Type: {media}\r\n" if media else ""
    return (f"HTTP/1.1 {status} {reason}\r\n{API_HEADER}{kind}Content-Length: {length}\r\n{extra}\r\n"
            ).encode("latin-1")


def _error(sock: socket.socket, status: int, reason: str, code: str, message: str, extra: str) -> None:
    body = json.dumps({"errors": [{"code": code, "message": message}]}).encode()
    sock.sendall(_head(status, reason, len(body), extra, "application/json") + body)


_servers: weakref.WeakKeyDictionary[object, BlobServer] = weakref.WeakKeyDictionary()
_guard = threading.Lock()


def blob_server(owner: object, store: Store, host: str, cert_file: str = "", key_file: str = "",
                port: int = 0) -> BlobServer:
    """The blob server of ``owner`` (the app: one per daemon), started on the first call (with TLS when
    ``cert_file`` is given: the daemon's own certificate) and closed when ``owner`` is collected or
    :func:`close_blob_server` is called."""
    with _guard:
        server = _servers.get(owner)
        if server is None:
            tls = server_context(cert_file, key_file) if cert_file else None
            server = _servers[owner] = BlobServer(store, host, tls, port)
            weakref.finalize(owner, server.close)
        return server


def close_blob_server(owner: object) -> None:
    """Stop ``owner``'s blob server, if it was started (for a daemon's shutdown)."""
    with _guard:
        server = _servers.pop(owner, None)
    if server is not None:
        server.close()


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """The TLS context the blob server answers with: the daemon's certificate and key."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert_file, key_file or None)
    return ctx
