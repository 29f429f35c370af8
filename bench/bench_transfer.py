"""Benchmark: a node's ``/v2/`` blob GET versus nginx, and a registry pull versus bare curl, side by side.

Usage: ``.venv/bin/python bench/bench_transfer.py [--rounds N] [--json FILE]``. Needs nginx (``apt-get
install nginx-light``), curl, Debian's ``docker-registry`` and Gemma 3 270M (else SmolLM2) in
``~/.cache/llmman/models``.

Part 1, serving (issue 17 target 5: >= 0.9 of nginx). One llmman daemon (``llmman serve`` on loopback)
stores the model; nginx (a throw-away config: loopback port, ``sendfile on``, no system service) serves
the very same file. Per round, warm page cache, one ``curl -o /dev/null`` each:

* ``nginx``: nginx serving the file;
* ``llmman blob server``: ``GET /v2/<name>/blobs/<digest>`` with ``X-Llmman-Blob-Redirect: 1`` (what
  llmman's pulls and copies send), ``307`` followed (``curl -L``) to the daemon's sendfile server;
* ``llmman inline``: the same GET without the header, answered on the event loop (what other clients get,
  and what every client got before the blob server).

For each llmman row the daemon's CPU per GB is split into its main thread (the event loop that relays
inference) and the rest, and a thread asks ``GET /api/version`` every 10 ms during the transfer: the worst
latency it saw is the loop's stall.

Part 2, pulls (target: >= 0.8 of bare curl). Pushes the model to ``docker-registry`` on loopback, then per
round: ``Puller.pull`` into a fresh store (verified, fsynced, renamed in), ``curl -o`` of the same blobs
(parallel, unverified), and ``curl | tee | sha256sum`` (the same verified download with standard tools);
``sync`` before each. Also a copy from the llmman node (``Puller.pull`` of ``<node>/<name>``, which takes
the blob server) against ``curl -L`` of the same blob.

Prints a table (best of N MB/s and the median of the per-round ratios) and writes it as JSON with --json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from tests.integration.daemons import Daemon, free_port, start_daemon  # noqa: E402
from tests.integration.registry import start_registry  # noqa: E402
from tests.integration.test_aggregation_tls import Pki, make_pki  # noqa: E402

from llmman.refs import parse_reference  # noqa: E402
from llmman.registry.client import BLOB_REDIRECT, RegistryOptions  # noqa: E402
from llmman.registry.puller import Puller  # noqa: E402
from llmman.registry.push import push  # noqa: E402
from llmman.store import Store  # noqa: E402

MODELS = Path.home() / ".cache" / "llmman" / "models"
NAME = "bench/model:1"

NGINX_CONF = """daemon off; master_process off; worker_processes 1; pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log;
events {{ worker_connections 64; }}
http {{
  access_log off; sendfile on; tcp_nopush on; default_type application/octet-stream;
  client_body_temp_path {tmp}/nb; proxy_temp_path {tmp}/np; fastcgi_temp_path {tmp}/nf;
  uwsgi_temp_path {tmp}/nu; scgi_temp_path {tmp}/ns;
  server {{ listen 127.0.0.1:{port}{tls}; root {root}; }}
}}
"""


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _curl(url: str, out: str = "/dev/null", headers: dict[str, str] | None = None, cacert: str = ""
          ) -> tuple[float, int]:
    """One ``curl`` (following redirects); (seconds, bytes received)."""
    args = ["curl", "-sfL", "-o", out, "-w", "%{size_download}", url]
    args += ["--cacert", cacert] if cacert else []
    for k, v in (headers or {}).items():
        args += ["-H", f"{k}: {v}"]
    t0 = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, int(done.stdout.strip() or 0)


class _Watch:
    """During a transfer: the daemon's CPU (main thread = the event loop, and the rest) and, when
    ``ping``, the worst ``GET /api/version`` latency, asked every 10 ms (a separate pass: the pings cost
    CPU the transfer would otherwise have)."""

    def __init__(self, d: Daemon, ping: bool, cacert: str = "") -> None:
        self.proc = psutil.Process(d.process.pid)
        self.verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=cacert) if cacert else True
        self.url = d.url + "/api/version"
        self.ping = ping
        self.worst = 0.0
        self.pings = 0
        self._stop = threading.Event()

    def _times(self) -> tuple[float, float]:
        threads = {t.id: t.user_time + t.system_time for t in self.proc.threads()}
        main = threads.get(self.proc.pid, 0.0)
        cpu = self.proc.cpu_times()
        return main, cpu.user + cpu.system - main

    def _ping(self) -> None:
        with httpx.Client(timeout=30, verify=self.verify) as c:
            while not self._stop.wait(0.01):
                t0 = time.perf_counter()
                try:
                    c.get(self.url)
                except httpx.HTTPError as exc:
                    print(f"GET /api/version failed: {exc!r}", file=sys.stderr)
                self.worst = max(self.worst, time.perf_counter() - t0)
                self.pings += 1

    def run(self, work: Callable[[], tuple[float, int]]) -> tuple[float, int, float, float, float]:
        """(seconds, bytes, loop CPU s, other CPU s, worst version latency s) of ``work``."""
        main0, rest0 = self._times()
        pinger = threading.Thread(target=self._ping, daemon=True)
        if self.ping:
            pinger.start()
        try:
            seconds, size = work()
        finally:
            self._stop.set()
            if self.ping:
                pinger.join()
        main1, rest1 = self._times()
        return seconds, size, main1 - main0, rest1 - rest0, self.worst


def serving(d: Daemon, digest: str, size: int, blob: Path, tmp: Path, rounds: int, pki: Pki | None = None
            ) -> dict[str, object]:
    """Part 1: nginx, the blob server and the inline route, each curl'd ``rounds`` times (over TLS with
    ``pki``: nginx with the same certificate as the daemon)."""
    tmp = tmp / ("nginx-tls" if pki else "nginx")
    root = tmp / "www"
    root.mkdir(parents=True)
    (root / "blob").symlink_to(blob)
    port = free_port("127.0.0.1")
    conf = tmp / "nginx.conf"
    tls = f" ssl; ssl_certificate {pki.cert}; ssl_certificate_key {pki.key}" if pki else ""
    conf.write_text(NGINX_CONF.format(tmp=tmp, port=port, root=root, tls=tls))
    scheme, cacert = ("https", str(pki.ca)) if pki else ("http", "")
    curl = functools.partial(_curl, cacert=cacert)
    nginx = subprocess.Popen(["nginx", "-c", str(conf), "-p", str(tmp)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if httpx.head(f"{scheme}://127.0.0.1:{port}/blob", verify=False).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        v2 = f"{d.url}/v2/{NAME.split(':')[0]}/blobs/{digest}"
        rows: dict[str, list[tuple[float, float, float]]] = {"nginx": [], "llmman blob server": [],
                                                                     "llmman inline": []}
        curl(f"{scheme}://127.0.0.1:{port}/blob")  # warm the page cache
        for i in range(rounds):
            for label in rows:
                if label == "nginx":
                    seconds, got = curl(f"{scheme}://127.0.0.1:{port}/blob")
                    loop = rest = 0.0
                else:
                    ask = {BLOB_REDIRECT: "1"} if label == "llmman blob server" else {}
                    fetch = functools.partial(curl, v2, headers=ask)
                    seconds, got, loop, rest, _ = _Watch(d, False).run(fetch)
                if got != size:
                    raise RuntimeError(f"{label}: got {got} of {size} bytes")
                rows[label].append((size / seconds, loop / (size / 1e9), rest / (size / 1e9)))
            print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1][0] / 1e6:.0f} MB/s" for k, v in rows.items()),
                  flush=True)
        stalls = {"nginx": 0.0}
        for label, ask in (("llmman blob server", {BLOB_REDIRECT: "1"}), ("llmman inline", {})):
            stalls[label] = _Watch(d, True, cacert).run(functools.partial(curl, v2, headers=ask))[4]
    finally:
        nginx.terminate()
        nginx.wait(10)
    nginx_rates = [r[0] for r in rows["nginx"]]
    out: dict[str, object] = {}
    for label, got_rows in rows.items():
        rates = [r[0] for r in got_rows]
        ratios = [a / b for a, b in zip(rates, nginx_rates, strict=True)]
        out[label] = {"best_mb_s": max(rates) / 1e6, "median_ratio_to_nginx": statistics.median(ratios),
                      "best_ratio_to_nginx": max(rates) / max(nginx_rates),
                      "loop_cpu_s_per_gb": statistics.median(r[1] for r in got_rows),
                      "other_cpu_s_per_gb": statistics.median(r[2] for r in got_rows),
                      "worst_api_version_ms": stalls[label] * 1e3}
    return out


def pulls(d: Daemon, node_manifest: dict[str, Any], model: Path, tmp: Path, rounds: int) -> dict[str, object]:
    """Part 2: Puller vs curl from docker-registry, and a copy from the node vs curl -L from it."""
    reg = start_registry(tmp / "registry")
    try:
        node = d.url.removeprefix("http://")
        options = RegistryOptions(insecure_registries=(reg.host, node))
        ref = parse_reference(f"{reg.host}/{NAME}")
        src = Store(tmp / "src")
        stored = src.build(ref, model)
        push(src, ref, None, lambda _: None, options=options)
        descs = [*stored.manifest["layers"], stored.manifest["config"]]
        total = sum(int(x["size"]) for x in descs)
        series: dict[str, list[float]] = {"llmman pull": [], "curl": [], "curl, then sync FILE": [],
                                          "curl | tee | sha256sum": [], "llmman copy from node": [],
                                          "curl -L from node": []}
        cpu: dict[str, list[float]] = {"llmman pull": [], "curl": []}  # CPU s per GB

        def pull(reference: str, total: int = total) -> float:
            dst = Store(tmp / "dst")
            os.sync()
            cpu0, t0 = _cpu(resource.RUSAGE_SELF), time.perf_counter()
            Puller(dst, options=options).pull(parse_reference(reference))
            seconds = time.perf_counter() - t0
            if reference.startswith(reg.host):
                cpu["llmman pull"].append((_cpu(resource.RUSAGE_SELF) - cpu0) / (total / 1e9))
            shutil.rmtree(dst.root)
            return total / seconds

        node_descs = [*node_manifest["layers"], node_manifest["config"]]
        node_total = sum(int(x["size"]) for x in node_descs)  # its config names the model otherwise

        def curl_all(base: str, shell: str, headers: str = "", descs: list[dict[str, Any]] = descs) -> float:
            out = tmp / "curl"
            out.mkdir()
            os.sync()
            cpu0, t0 = _cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
            procs = [subprocess.Popen(["sh", "-c", shell.format(url=f"{base}/blobs/{x['digest']}",
                                                                file=out / str(x["digest"]).split(":")[1],
                                                                headers=headers)]) for x in descs]
            if any(p.wait() for p in procs):
                raise RuntimeError(f"curl failed: {shell}")
            seconds = time.perf_counter() - t0
            size = sum(int(x["size"]) for x in descs)
            if shell.startswith("curl -sf -o"):
                cpu["curl"].append((_cpu(resource.RUSAGE_CHILDREN) - cpu0) / (size / 1e9))
            shutil.rmtree(out)
            return size / seconds

        registry_base = f"http://{reg.host}/v2/{NAME.split(':')[0]}"
        node_base = f"{d.url}/v2/{NAME.split(':')[0]}"
        for i in range(rounds):
            series["llmman pull"].append(pull(f"{reg.host}/{NAME}"))
            series["curl"].append(curl_all(registry_base, "curl -sf -o {file} {url}"))
            series["curl, then sync FILE"].append(curl_all(registry_base,
                                                           "curl -sf -o {file} {url} && sync {file}"))
            series["curl | tee | sha256sum"].append(curl_all(
                registry_base, "curl -sf {url} | tee {file} | sha256sum >/dev/null"))
            series["llmman copy from node"].append(pull(f"{node}/{NAME}", node_total))
            series["curl -L from node"].append(curl_all(node_base, "curl -sfL {headers} -o {file} {url}",
                                                        f"-H '{BLOB_REDIRECT}: 1'", node_descs))
            print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1] / 1e6:.0f} MB/s" for k, v in series.items()),
                  flush=True)
    finally:
        reg.stop()
    base_of = {"llmman pull": "curl", "curl | tee | sha256sum": "curl", "curl, then sync FILE": "curl",
               "llmman copy from node": "curl -L from node"}
    out: dict[str, object] = {"bytes": total,
                              "cpu_s_per_gb": {k: statistics.median(v) for k, v in cpu.items()}}
    for label, rates in series.items():
        row: dict[str, float] = {"best_mb_s": max(rates) / 1e6}
        if label in base_of:
            other = series[base_of[label]]
            row["median_ratio"] = statistics.median(a / b for a, b in zip(rates, other, strict=True))
            row["best_ratio"] = max(rates) / max(other)
        out[label] = row
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--skip-pulls", action="store_true", help="part 1 only")
    parser.add_argument("--tls", action="store_true", help="part 1 once more over TLS (needs openssl)")
    args = parser.parse_args()
    model = next((p for p in (MODELS / "gemma-3-270m-q4_k_m.gguf", MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf")
                  if p.is_file()), None)
    missing = [b for b in ("nginx", "curl", "docker-registry") if not shutil.which(b)]
    if model is None or missing:
        print(f"needs a model (scripts/setup.sh --model) and {', '.join(missing) or 'nothing else'}",
              file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="llmman-bench-transfer-"))
    try:
        stored = Store(tmp / "node" / "store").build(parse_reference(NAME), model)
        layer = max(stored.manifest["layers"], key=lambda x: int(x["size"]))
        digest, size = str(layer["digest"]), int(layer["size"])
        d = start_daemon(tmp / "node")
        try:
            blob = (tmp / "node" / "store" / "blobs" / "sha256" / digest.split(":")[1]).resolve()
            result: dict[str, object] = {"model": model.name, "blob_bytes": size, "rounds": args.rounds,
                                         "cpus": os.cpu_count(), "load_before": os.getloadavg()[0]}
            result["serving"] = serving(d, digest, size, blob, tmp, args.rounds)
            if not args.skip_pulls:
                result["pulls"] = pulls(d, stored.manifest, model, tmp, args.rounds)
        finally:
            d.stop()
        if args.tls:
            (tmp / "pki").mkdir()
            pki = make_pki(tmp / "pki")
            shutil.copytree(tmp / "node" / "store", tmp / "tls" / "store", symlinks=True)
            env = {"LLMMAN_TLS_CERT": str(pki.cert), "LLMMAN_TLS_KEY": str(pki.key),
                   "LLMMAN_TLS_CA": str(pki.ca)}
            d = start_daemon(tmp / "tls", extra_env=env)
            try:
                result["serving_tls"] = serving(d, digest, size, blob, tmp, args.rounds, pki)
            finally:
                d.stop()
        _print(result)
        if args.json:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _print(result: dict[str, object]) -> None:
    print(f"\nmodel {result['model']}, blob {int(str(result['blob_bytes'])) / 1e6:.0f} MB, best of "
          f"{result['rounds']} rounds, {result['cpus']} CPUs, load {float(str(result['load_before'])):.1f}")
    for part in ("serving", "serving_tls"):
        serving_rows = result.get(part)
        if not isinstance(serving_rows, dict):
            continue
        print(f"{part:24}{'MB/s':>8}{'/nginx':>8}{'median':>8}{'loop s/GB':>10}{'rest s/GB':>10}"
              f"{'stall ms':>9}")
        for label, row in serving_rows.items():
            print(f"{label:24}{row['best_mb_s']:>8.0f}{row['best_ratio_to_nginx']:>8.2f}"
                  f"{row['median_ratio_to_nginx']:>8.2f}{row['loop_cpu_s_per_gb']:>10.2f}"
                  f"{row['other_cpu_s_per_gb']:>10.2f}{row['worst_api_version_ms']:>9.1f}")
    pull_rows = result.get("pulls")
    if isinstance(pull_rows, dict):
        print(f"{'pulls':24}{'MB/s':>8}{'ratio':>8}{'median':>8}")
        for label, row in pull_rows.items():
            if isinstance(row, dict) and "best_mb_s" in row:
                ratio = f"{row['best_ratio']:>8.2f}{row['median_ratio']:>8.2f}" if "best_ratio" in row else ""
                print(f"{label:24}{row['best_mb_s']:>8.0f}{ratio}")
        print("CPU s/GB (median): " + ", ".join(f"{k} {v:.2f}" for k, v in pull_rows["cpu_s_per_gb"].items()))


if __name__ == "__main__":
    raise SystemExit(main())
