"""FAKE Hugging Face Hub: the few HTTP routes ``huggingface_hub`` uses to download a model repository.

The only fake of the registry work (Hugging Face cannot be reached from the tests). Serves one repository
per ``files`` mapping ``path -> bytes``: ``GET /api/models/<repo>[/revision/<rev>]`` (model info with
``sha``), ``GET /api/models/<repo>/tree/<rev>`` (the file list with LFS sha256), and ``HEAD``/``GET
/<repo>/resolve/<rev>/<path>`` with ``Range``. Unknown repositories answer 404 with
``X-Error-Code: RepositoryNotFound`` as the Hub does.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SHA = "0123456789abcdef0123456789abcdef01234567"
_JSON = {"Content-Type": "application/json"}


class FakeHub:
    """``FakeHub({"owner/repo": {"file.gguf": b"..."}})``; ``.url`` is the endpoint for HF_ENDPOINT."""

    def __init__(self, repos: dict[str, dict[str, bytes]]) -> None:
        self.repos = repos
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                hub.handle(self, head=True)

            def do_GET(self) -> None:
                hub.handle(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _send(self, h: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str],
              head: bool) -> None:
        h.send_response(status)
        for k, v in {"Content-Length": str(len(body)), **headers}.items():
            h.send_header(k, v)
        h.end_headers()
        if not head:
            h.wfile.write(body)

    def handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        path = h.path.split("?", 1)[0]
        for repo, files in self.repos.items():
            if path in (f"/api/models/{repo}", f"/api/models/{repo}/revision/main"):
                info = {"id": repo, "sha": SHA, "siblings": [{"rfilename": p} for p in files]}
                return self._send(h, 200, json.dumps(info).encode(), _JSON, head)
            if path.startswith(f"/api/models/{repo}/tree/"):
                tree = [{"type": "file", "path": p, "size": len(b), "oid": hashlib.sha1(b).hexdigest(),
                         "lfs": {"oid": hashlib.sha256(b).hexdigest(), "size": len(b), "pointerSize": 130}}
                        for p, b in files.items()]
                return self._send(h, 200, json.dumps(tree).encode(), _JSON, head)
            m = re.fullmatch(rf"/{re.escape(repo)}/resolve/[^/]+/(.+)", path)
            if m and m.group(1) in files:
                data = files[m.group(1)]
                etag = hashlib.sha256(data).hexdigest()
                headers = {"X-Repo-Commit": SHA, "ETag": f'"{etag}"', "X-Linked-Etag": f'"{etag}"',
                           "X-Linked-Size": str(len(data)), "Accept-Ranges": "bytes",
                           "Content-Type": "application/octet-stream"}
                rng = re.fullmatch(r"bytes=(\d+)-", h.headers.get("Range", ""))
                if rng and not head:
                    start = int(rng.group(1))
                    headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                    return self._send(h, 206, data[start:], headers, head)
                return self._send(h, 200, data, headers, head)
        self._send(h, 404, b'{"error": "Repository not found"}',
                   {"X-Error-Code": "RepositoryNotFound", "Content-Type": "application/json"}, head)
