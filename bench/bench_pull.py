"""Benchmark: ``llmman pull`` from a local registry versus ``curl`` fetching the same blobs.

Usage: ``.venv/bin/python bench/bench_pull.py [--rounds N]``. Starts Debian's ``docker-registry`` on a
loopback port, pushes Gemma 3 270M (``~/.cache/llmman/models/gemma-3-270m-q4_k_m.gguf``, 253 MB; else
SmolLM2) as a ModelPack artifact, then per round: pulls it into a fresh store with the Puller (verified,
fsynced, renamed into the store), and fetches the same blobs with ``curl -o`` into a temp folder (no
verification), and once more as ``curl | tee FILE | sha256sum`` (the same verified download with
standard tools). Prints each round's throughputs and their ratio (the two run back to back, so they share
whatever else the machine is doing), the best-of-N of each, their ratio (target >= 0.9), the median of
the per-round ratios, and llmman's CPU seconds per GB (process CPU time during the pull, all threads).
``sync`` runs before each timed part so neither pays for the other's dirty pages.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from tests.integration.registry import start_registry  # noqa: E402

from llmman.refs import parse_reference  # noqa: E402
from llmman.registry.client import RegistryOptions  # noqa: E402
from llmman.registry.puller import Puller  # noqa: E402
from llmman.registry.push import push  # noqa: E402
from llmman.store import Store  # noqa: E402

MODELS = Path.home() / ".cache" / "llmman" / "models"


def _cpu(who: int = resource.RUSAGE_SELF) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model = next((p for p in (MODELS / "gemma-3-270m-q4_k_m.gguf", MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf")
                  if p.is_file()), None)
    if model is None or not shutil.which("docker-registry") or not shutil.which("curl"):
        print("needs docker-registry, curl and a model (scripts/setup.sh --model)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="llmman-bench-pull-"))
    reg = start_registry(tmp / "registry")
    try:
        options = RegistryOptions(insecure_registries=(reg.host,))
        ref = parse_reference(f"{reg.host}/bench/model:1")
        src = Store(tmp / "src")
        stored = src.build(ref, model)
        push(src, ref, None, lambda _: None, options=options)
        digests = [d["digest"] for d in stored.manifest["layers"]] + [stored.manifest["config"]["digest"]]
        total = sum(d["size"] for d in stored.manifest["layers"]) + stored.manifest["config"]["size"]
        best_pull, best_curl, cpu_per_gb = 0.0, 0.0, 0.0
        ratios: list[float] = []
        best_hashed, hashed_ratios = 0.0, []
        for i in range(args.rounds):
            dst = Store(tmp / f"dst{i}")
            os.sync()  # each side starts with no dirty pages left by the other (writeback throttling)
            cpu0, t0 = _cpu(), time.perf_counter()
            Puller(dst, options=options).pull(ref)
            elapsed, cpu = time.perf_counter() - t0, _cpu() - cpu0
            pull_rate = total / elapsed
            if total / elapsed > best_pull:
                best_pull, cpu_per_gb = total / elapsed, cpu / (total / 1e9)
            shutil.rmtree(dst.root)
            out = tmp / f"curl{i}"
            out.mkdir()
            os.sync()
            t0, child0 = time.perf_counter(), _cpu(resource.RUSAGE_CHILDREN)
            procs = [subprocess.Popen(["curl", "-sf", "-o", str(out / d.split(":")[1]),
                                       f"http://{reg.host}/v2/bench/model/blobs/{d}"]) for d in digests]
            if any(p.wait() for p in procs):
                raise RuntimeError("curl failed")
            curl_rate = total / (time.perf_counter() - t0)
            curl_cpu = (_cpu(resource.RUSAGE_CHILDREN) - child0) / (total / 1e9)
            best_curl = max(best_curl, curl_rate)
            shutil.rmtree(out)
            out.mkdir()  # the same, verified as a pull must be: curl | tee FILE | sha256sum
            os.sync()
            t0 = time.perf_counter()
            procs = [subprocess.Popen(["sh", "-c", f"curl -sf http://{reg.host}/v2/bench/model/blobs/{d} "
                                       f"| tee {out / d.split(':')[1]} | sha256sum >/dev/null"])
                     for d in digests]
            if any(p.wait() for p in procs):
                raise RuntimeError("curl | sha256sum failed")
            hashed_rate = total / (time.perf_counter() - t0)
            best_hashed = max(best_hashed, hashed_rate)
            hashed_ratios.append(pull_rate / hashed_rate)
            shutil.rmtree(out)
            ratios.append(pull_rate / curl_rate)
            print(f"round {i + 1}: llmman {pull_rate / 1e6:.0f} MB/s ({cpu / (total / 1e9):.2f} CPU s/GB), "
                  f"curl {curl_rate / 1e6:.0f} MB/s ({curl_cpu:.2f} CPU s/GB), ratio {ratios[-1]:.2f}; "
                  f"curl|sha256sum {hashed_rate / 1e6:.0f} MB/s, ratio {hashed_ratios[-1]:.2f}")
        print(f"model: {model.name} ({total / 1e6:.0f} MB), best of {args.rounds}")
        print(f"{'':12}{'MB/s':>10}")
        print(f"{'llmman pull':12}{best_pull / 1e6:>10.0f}")
        print(f"{'curl':12}{best_curl / 1e6:>10.0f}")
        print(f"ratio llmman/curl: {best_pull / best_curl:.2f} (target >= 0.9); median of the rounds' "
              f"ratios: {sorted(ratios)[len(ratios) // 2]:.2f}")
        print(f"{'curl|sha256':12}{best_hashed / 1e6:>10.0f}")
        print(f"ratio llmman/(curl | tee | sha256sum), the same verified download: "
              f"{best_pull / best_hashed:.2f}; median {sorted(hashed_ratios)[len(hashed_ratios) // 2]:.2f}")
        print(f"llmman CPU: {cpu_per_gb:.2f} s per GB")
    finally:
        reg.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
