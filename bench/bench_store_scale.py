"""Benchmark: the list routes of a daemon whose store holds thousands of models (issue 17, target 4).

Usage: ``.venv/bin/python bench/bench_store_scale.py [--models N] [--requests R] [--before-requests B]
[--before REV] [--json OUT]``. No model and no llama-server are needed: nothing is loaded.

1. A store of ``--models`` (2,000) models is written in a temporary folder, each its own tiny synthetic GGUF
   (``tests/unit/ggufgen.py``, 24 KB, a distinct ``general.name`` so every blob differs), packaged as
   ``llmman build`` packages it (``llmman.store.build``) but named in one write of ``index.json``.
2. Two real ``llmman serve`` daemons serve that one store side by side (own HOME and port each,
   ``tests/integration/daemons.py``): **after** is this working tree; **before** is the source of ``--before``
   (default: the commit before ``src/llmman/store/listing.py`` was added), extracted with ``git archive`` and
   put first on the daemon's ``PYTHONPATH`` (checked: ``llmman.store.listing`` does not import there).
3. Once the store's stamps are older than ``llmman.store.listing.RACY_S`` (a store written a while ago),
   each of ``/api/tags``, ``/v1/models`` and ``/llmman/node`` is asked of both daemons: one first request
   (a cold listing: every manifest and GGUF header read), then ``--before-requests`` (20) timed requests to
   before and ``--requests`` (200) to after, over one keep-alive connection each. Reported: p50/p95 in ms
   and before/after as a ratio; then ``/api/version`` the same way, the floor of one request on the machine.
4. **After a write.** ``--writes`` (10) times: another process's change (a second ``Store`` object in this
   process tags a model, so only the files tell) and at once one ``/api/tags`` and one ``/llmman/node`` of
   the after daemon: the listing read again (in a thread), and the new name is checked to be there.

Timings are reported, never asserted; the exit status is non-zero only when a request or the set-up
failed. Results go to ``bench/results-store-scale-<date>.json`` (or ``--json``).
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ggufgen import write_gguf
from tests.integration.daemons import Daemon, start_daemon

from llmman.refs import parse_reference
from llmman.store import Store, stored_name
from llmman.store import mediatypes as mt
from llmman.store.build import build_manifest, plan_build
from llmman.store.listing import RACY_S

REPO = Path(__file__).resolve().parents[1]
ROUTES = ("/api/tags", "/v1/models", "/llmman/node")
NAME_MARK = b"bench-model-000000"


class BenchError(Exception):
    """The set-up or a request failed."""


def populate(root: Path, count: int, scratch: Path) -> None:
    """``count`` models named ``bench/model-<i>:q4`` in a store at ``root``, each with its own GGUF blob."""
    template = write_gguf(scratch / "template.gguf", name=NAME_MARK.decode()).read_bytes()
    store = Store(root)
    entries = []
    for i in range(count):
        path = scratch / f"m{i}.gguf"
        path.write_bytes(template.replace(NAME_MARK, f"bench-model-{i:06d}".encode()))
        ref = parse_reference(f"bench/model-{i}:q4")
        manifest = build_manifest(store.layout, ref, plan_build(path), written=[])
        digest = store.layout.write_blob([manifest])
        entries.append({"mediaType": mt.OCI_MANIFEST, "digest": digest, "size": len(manifest),
                        "artifactType": mt.MODEL_ARTIFACT, "annotations": {mt.REF_NAME: stored_name(ref)}})
        path.unlink()
    with store.layout.lock():
        index = store.layout.read_index()
        index["manifests"] = entries
        store.layout.write_index(index)


def before_rev(given: str | None) -> str:
    """``given``, else the parent of the commit that added the store's listing."""
    if given:
        return given
    added = subprocess.run(["git", "log", "--format=%H", "--diff-filter=A", "-n1", "--",
                            "src/llmman/store/listing.py"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.strip()
    if not added:
        raise BenchError("src/llmman/store/listing.py is not committed yet: pass --before REV")
    return f"{added}^"


def extract(rev: str, into: Path) -> Path:
    """The ``src/`` of ``rev`` under ``into``; checked to be the code without the listing."""
    archive = subprocess.run(["git", "archive", rev, "src"], cwd=REPO, capture_output=True, check=True).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    src = into / "src"
    probe = subprocess.run([sys.executable, "-c", "import llmman.store.listing"], env={
        **os.environ, "PYTHONPATH": str(src)}, capture_output=True, cwd=into)
    if probe.returncode == 0:
        raise BenchError(f"{rev} already has llmman.store.listing: not the code before the index")
    return src


def old_enough(store: Path) -> bool:
    """Every stamp the listing compares is older than RACY_S (the kept listing is trusted)."""
    newest = max(max(st.st_mtime, st.st_ctime) for st in (os.stat(store / "index.json"),
                                                          os.stat(store / "blobs" / "sha256")))
    return time.time() - newest > RACY_S + 0.1


class Client:
    """One keep-alive HTTP/1.1 connection with the standard library's client: httpx costs ~3 ms more per
    request on this machine, which would hide what the daemon does."""

    def __init__(self, url: str) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self.url = url
        self.connection = http.client.HTTPConnection(host, int(port), timeout=120)

    def get(self, path: str) -> bytes:
        try:
            self.connection.request("GET", path)
            answer = self.connection.getresponse()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            self.connection.close()  # idle past the server's keep-alive timeout: connect again, once
            self.connection.request("GET", path)
            answer = self.connection.getresponse()
        body = answer.read()
        if answer.status != 200:
            raise BenchError(f"{self.url}{path}: {answer.status} {body[:200]!r}")
        return body

    def close(self) -> None:
        self.connection.close()


def timed(client: Client, path: str) -> tuple[float, int]:
    """One GET: (milliseconds until the body was read, body bytes)."""
    start = time.perf_counter()
    body = client.get(path)
    return (time.perf_counter() - start) * 1e3, len(body)


def count_of(path: str, body: Any) -> int:
    """How many models a list route's answer holds."""
    if path == "/api/tags":
        return len(body["models"])
    if path == "/v1/models":
        return len(body["data"])
    return len(body["stored"])


def quantiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return {"p50": statistics.median(ordered), "p95": p95, "n": len(ordered)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--models", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=200, help="timed requests per route (after)")
    parser.add_argument("--before-requests", type=int, default=20, help="timed requests per route (before)")
    parser.add_argument("--writes", type=int, default=10, help="listings right after another process's write")
    parser.add_argument("--before", help="the revision to compare with (default: before the listing)")
    parser.add_argument("--json", type=Path, help="where to write the results")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-store-"))
    daemons: list[Daemon] = []
    try:
        rev = before_rev(args.before)
        old_src = extract(rev, tmp / "before-src")
        store = tmp / "store"
        start = time.perf_counter()
        populate(store, args.models, tmp)
        print(f"store: {args.models} models written in {time.perf_counter() - start:.1f} s "
              f"({sum(p.stat().st_size for p in (store / 'blobs' / 'sha256').iterdir()) / 1e6:.0f} MB); "
              f"before = {rev}")
        shared = {"LLMMAN_MODELS": str(store), "LLMMAN_DEBUG": "0"}
        after = start_daemon(tmp / "after", extra_env=shared)
        daemons.append(after)
        before = start_daemon(tmp / "before", extra_env={**shared, "PYTHONPATH": str(old_src)})
        daemons.append(before)
        deadline = time.monotonic() + 30
        while not old_enough(store):  # waiting on the condition the kept listing needs: old stamps
            if time.monotonic() > deadline:
                raise BenchError("the store's stamps did not age")
            time.sleep(0.05)
        results: dict[str, Any] = {"models": args.models, "before": rev, "routes": {}}
        print(f"\n{'route':<14}{'first b/a ms':>20}{'before p50/p95 ms':>22}{'after p50/p95 ms':>20}"
              f"{'ratio p50':>11}{'ratio p95':>11}{'KB':>7}")
        b, a = Client(before.url), Client(after.url)
        try:
            for path in ROUTES:
                firsts = timed(b, path)[0], timed(a, path)[0]
                for side in (b, a):
                    found = count_of(path, json.loads(side.get(path)))
                    if found != args.models:
                        raise BenchError(f"{path} on {side.url} listed {found} of {args.models}")
                old = quantiles([timed(b, path)[0] for _ in range(args.before_requests)])
                samples = [timed(a, path) for _ in range(args.requests)]
                new = quantiles([s[0] for s in samples])
                row = {"first_before_ms": firsts[0], "first_after_ms": firsts[1], "before": old, "after": new,
                       "ratio_p50": old["p50"] / new["p50"], "ratio_p95": old["p95"] / new["p95"],
                       "body_bytes": samples[0][1]}
                results["routes"][path] = row
                print(f"{path:<14}{firsts[0]:>10.1f} / {firsts[1]:<7.1f}{old['p50']:>11.1f} / "
                      f"{old['p95']:<8.1f}{new['p50']:>10.2f} / {new['p95']:<7.2f}{row['ratio_p50']:>10.0f}x"
                      f"{row['ratio_p95']:>10.0f}x{samples[0][1] / 1e3:>7.0f}")
            floor = [quantiles([timed(side, "/api/version")[0] for _ in range(args.requests)])
                     for side in (b, a)]
            results["/api/version"] = {"before": floor[0], "after": floor[1]}
            print(f"{'/api/version':<14}{'':>20}{floor[0]['p50']:>11.2f} / {floor[0]['p95']:<8.2f}"
                  f"{floor[1]['p50']:>10.2f} / {floor[1]['p95']:<7.2f}   (a request's floor here)")
            writer = Store(store)  # its own index and write counter: like another process
            fresh: dict[str, list[float]] = {"/api/tags": [], "/llmman/node": []}
            for i in range(args.writes):
                name = f"bench/tagged-{i}:q4"
                writer.tag(parse_reference("bench/model-0:q4"), parse_reference(name))
                for path in fresh:
                    start = time.perf_counter()
                    body = json.loads(a.get(path))
                    fresh[path].append((time.perf_counter() - start) * 1e3)
                    listed = body["models"] if path == "/api/tags" else [{"name": n} for n in body["stored"]]
                    if stored_name(parse_reference(name)) not in {m["name"] for m in listed}:
                        raise BenchError(f"{path} did not list {name} right after it was written")
            results["after_a_write"] = {p: quantiles(v) for p, v in fresh.items()}
            print(f"\nright after another process's write (after, {args.writes} writes): " + ", ".join(
                f"{p} p50 {q['p50']:.1f} ms p95 {q['p95']:.1f} ms"
                for p, q in results["after_a_write"].items()))
        finally:
            a.close()
            b.close()
        out = args.json or REPO / "bench" / f"results-store-scale-{datetime.date.today().isoformat()}.json"
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nwrote {out}")
        return 0
    except (BenchError, subprocess.CalledProcessError, OSError, http.client.HTTPException,
            RuntimeError) as exc:
        print(f"bench_store_scale: {exc}", file=sys.stderr)
        return 1
    finally:
        for d in daemons:
            d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
