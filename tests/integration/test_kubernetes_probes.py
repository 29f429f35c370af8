"""The DaemonSet's probes and preStop hook against a real daemon set up as its pod is.

The daemon gets the pod's environment from deploy/kubernetes/ (the settings ConfigMap, the keys of
keys.env.example, the node name) and listens on every address as in the pod; only the port (a free
one), the store (a temporary one) and the peers (no cluster DNS here) differ. Each probe is sent as the
kubelet sends it (to the pod's address and port, ``Host`` that address, ``User-Agent: kube-probe``, no
key), then the preStop command runs with the pod's environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.integration.daemons import free_port, start_daemon
from tests.kube_manifests import container, daemonset, pod_env

POD_ADDRESS = "10.244.3.17"  # what the kubelet puts in Host: the pod's IP


def _probe(port: int, probe: dict[str, object]) -> httpx.Response:
    """One httpGet probe as the kubelet sends it; success is a status from 200 to 399."""
    get = probe["httpGet"]
    assert isinstance(get, dict)
    headers = {"Host": f"{POD_ADDRESS}:{port}", "User-Agent": "kube-probe/1.30", "Accept": "*/*"}
    return httpx.get(f"http://127.0.0.1:{port}{get['path']}", headers=headers, timeout=10.0)


def test_the_probes_pass_without_a_key_and_the_prestop_drain_keeps_the_pod_ready(tmp_path: Path) -> None:
    env = pod_env()
    keys = env["LLMMAN_API_KEYS"].split(",")
    pod = {k: v for k, v in env.items() if k not in ("LLMMAN_HOST", "LLMMAN_MODELS")}
    pod.update(LLMMAN_PEERS="", LLMMAN_NODE_NAME="node-a")
    port = free_port("0.0.0.0")
    daemon = start_daemon(tmp_path, host="0.0.0.0", port=port, extra_env=pod)
    try:
        llmman = container(daemonset())
        for name in ("startupProbe", "readinessProbe", "livenessProbe"):
            answer = _probe(port, llmman[name])
            assert 200 <= answer.status_code < 400 and answer.json() == {"status": "ok"}, (name, answer.text)
        # the probes pass with the keys in force: a route that needs one refuses a request without it
        tags = f"http://127.0.0.1:{port}/api/tags"
        assert httpx.get(tags, timeout=10.0).status_code == 401
        for key in keys:  # the client key and the pool key (LLMMAN_PEER_API_KEY) both open it
            answer = httpx.get(tags, headers={"Authorization": f"Bearer {key}"}, timeout=10.0)
            assert answer.status_code == 200, answer.text
        assert env["LLMMAN_PEER_API_KEY"] in keys

        command = llmman["lifecycle"]["preStop"]["exec"]["command"]
        path = os.pathsep.join([str(Path(sys.executable).parent), daemon.env.get("PATH", "")])
        done = subprocess.run(command, env={**daemon.env, "PATH": path}, capture_output=True, text=True,
                              timeout=120, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "drained" in done.stdout
        # draining, the pod stays ready (its requests finish, its peers place nothing new on it)
        answer = _probe(port, llmman["readinessProbe"])
        assert answer.status_code == 200 and answer.json() == {"status": "draining"}
    finally:
        grace = daemonset()["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        code = daemon.stop(timeout=float(grace))  # SIGTERM, as the kubelet sends it after the preStop hook
    assert code == 0, daemon.log_text()
