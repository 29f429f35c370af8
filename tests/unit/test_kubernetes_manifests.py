"""deploy/kubernetes/ checked offline: every object against the Kubernetes API schemas (kubernetes-validate,
strict, pinned versions), every file listed by a kustomization, every LLMMAN_* variable a real setting
that parses, the probes on the route the daemon serves without a key, the Secret and ConfigMaps
referenced by the names the generators make, and the stop fitting in the termination grace.

Where ``kubectl`` is installed its kustomize renders each variant (the base, overlays/cpu, overlays/pvc)
and the rendered objects are checked too: the generators' hashed names rewritten into the DaemonSet,
the patches applied. No cluster is needed for any of it.
"""

from __future__ import annotations

import copy
import inspect
import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
from tests.kube_manifests import (
    BASE,
    DEPLOY,
    KEYS_EXAMPLE,
    KEYS_FILE,
    REPO,
    VARIANTS,
    Obj,
    base_objects,
    container,
    daemonset,
    find,
    generator,
    generators,
    kubectl,
    kustomization,
    kustomization_files,
    load_docs,
    pod_env,
    read_env,
    render,
    source,
    walk,
)

from llmman import daemon
from llmman.api.auth import OPEN_PATHS
from llmman.config.settings import SETTINGS, Settings, load_settings
from llmman.sched.scheduler import Scheduler

# The oldest Kubernetes release the manifests claim (generic ephemeral volumes, kustomize components and
# `labels` are all older), and the newest whose schemas kubernetes-validate ships here.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
NOT_LISTED = {BASE / ".gitignore"}  # read by git, not by kustomize (keys.env.example stands for keys.env)
needs_kubectl = pytest.mark.skipif(kubectl() is None, reason="kubectl (its built-in kustomize) not installed")


def _validate(obj: Obj) -> None:
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


def _settings(tmp_path: Path, extra: dict[str, str] | None = None) -> Settings:
    """The settings one pod runs with: its environment and /etc/llmman/llmman.conf (the ConfigMap)."""
    env = {**pod_env(), "LLMMAN_NODE_NAME": "node-a", "HOME": str(tmp_path), **(extra or {})}
    return load_settings(env=env, system_file=BASE / "llmman.conf", user_file=tmp_path / "none.conf")


# --- the kustomizations and their files ---------------------------------------------------------------


def _referenced(directory: Path) -> set[Path]:
    """The files and directories a kustomization in ``directory`` names, each checked to exist."""
    doc = kustomization(directory)
    paths = [directory / entry for entry in doc.get("resources", []) + doc.get("components", [])]
    paths += [directory / patch["path"] for patch in doc.get("patches", [])]
    for gen in generators(directory):
        paths += [*gen.envs, *gen.files.values()]
    for path in map(source, paths):
        assert path.exists(), f"{directory / 'kustomization.yaml'} names {path}, which does not exist"
        if path.is_dir():
            assert (path / "kustomization.yaml").is_file(), f"{path} has no kustomization.yaml"
    return {source(path).resolve() for path in paths}


def test_every_kustomization_names_existing_files_and_every_file_is_named() -> None:
    named: set[Path] = set()
    for path in kustomization_files():
        named |= _referenced(path.parent)
    present = {p.resolve() for p in DEPLOY.rglob("*") if p.is_file() and p.name != KEYS_FILE}
    not_named = present - named - {p.resolve() for p in kustomization_files()} - NOT_LISTED
    assert not not_named, f"files no kustomization lists: {sorted(map(str, not_named))}"
    dirs = {p.parent.resolve() for p in kustomization_files()}
    entry_points = {d.resolve() for d in VARIANTS.values()}
    assert dirs - named - entry_points == set(), "a kustomization that nothing uses and is not a variant"
    assert entry_points <= dirs


def test_the_variants_and_components_are_what_the_docs_say() -> None:
    assert kustomization(DEPLOY)["resources"] == ["base"]
    for name in ("cpu", "pvc"):
        assert kustomization(DEPLOY / "components" / name)["kind"] == "Component"
        assert kustomization(VARIANTS[name])["components"] == [f"../../components/{name}"]
    tags = {name: kustomization(path)["images"][0]["newTag"] for name, path in VARIANTS.items()}
    assert tags == {"gpu": "cuda", "cpu": "cpu", "pvc": "cuda"}
    images = {img["name"] for name, path in VARIANTS.items() for img in kustomization(path)["images"]}
    pod = _pod(daemonset())
    assert images == {c["image"] for c in pod["containers"] + pod["initContainers"]}


def test_the_keys_file_is_never_committed() -> None:
    assert KEYS_FILE in (BASE / ".gitignore").read_text(encoding="utf-8").split()
    assert [str(p) for g in generators(BASE) if g.kind == "Secret" for p in g.envs] == [str(BASE / KEYS_FILE)]
    tracked = subprocess.run(["git", "ls-files", "--", str(BASE / KEYS_FILE)], cwd=REPO, capture_output=True,
                             text=True, check=True, timeout=60)
    assert tracked.stdout == ""


# --- the schemas -----------------------------------------------------------------------------------------


def test_every_object_as_written_passes_the_schemas_strictly() -> None:
    objects = base_objects()
    assert {o["kind"] for o in objects} == {"Namespace", "Service", "DaemonSet"}
    for obj in objects:
        _validate(obj)
    for gen in generators(BASE):  # what the generators make, built here from the same files
        key = "stringData" if gen.kind == "Secret" else "data"
        _validate({"apiVersion": "v1", "kind": gen.kind, "metadata": {"name": gen.name}, key: gen.data()})


def test_the_strict_check_rejects_a_mistake() -> None:
    ds = copy.deepcopy(daemonset())
    port = container(ds)["ports"][0]
    port["containerport"] = port.pop("containerPort")  # a misspelt field
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(ds)
    ds = copy.deepcopy(daemonset())
    container(ds)["livenessProbe"]["httpGet"]["port"] = [17434]  # a wrong type
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(ds)


@needs_kubectl
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_each_rendered_variant_passes_the_schemas_and_references_what_it_renders(variant: str,
                                                                                 tmp_path: Path) -> None:
    objects = render(variant, tmp_path)
    for obj in objects:
        _validate(obj)
        assert obj["metadata"].get("namespace", "llmman") == "llmman"
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    pod = _pod(daemonset(objects))
    llmman = container(daemonset(objects))
    refs = [("ConfigMap", s["configMapRef"]["name"]) for s in llmman["envFrom"] if "configMapRef" in s]
    refs += [("Secret", s["secretRef"]["name"]) for s in llmman["envFrom"] if "secretRef" in s]
    refs += [("ConfigMap", v["configMap"]["name"]) for v in pod["volumes"] if "configMap" in v]
    assert len(refs) == 3 and set(refs) <= names, f"{refs} not among {sorted(names)}"
    made = {g.name for g in generators(BASE)}
    for _kind, name in refs:  # kustomize's hashed names, so a change of settings or keys rolls the pods
        assert name.rsplit("-", 1)[0] in made and name not in made, name
    secret = next(o for o in objects if o["kind"] == "Secret")
    assert set(secret["data"]) == set(read_env(KEYS_EXAMPLE))
    gpu = [v for k, v in walk(pod) if k == "nvidia.com/gpu"]
    volume = next(v for v in pod["volumes"] if v["name"] == "data")
    namespace = find(objects, "Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
    if variant == "cpu":
        assert gpu == [] and not pod.get("nodeSelector")
        memory = {e["name"]: e for e in llmman["env"]}["LLMMAN_MEMORY"]
        assert memory["valueFrom"]["resourceFieldRef"] == {"containerName": "llmman",
                                                           "resource": "limits.memory"}
    else:
        assert gpu == [1] and pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    if variant == "pvc":
        claim = volume["ephemeral"]["volumeClaimTemplate"]["spec"]
        assert "hostPath" not in volume and claim["accessModes"] == ["ReadWriteOnce"]
        assert not pod.get("initContainers") and namespace == "restricted"
        _restricted(pod)
    else:
        assert volume["hostPath"]["path"] == "/var/lib/llmman" and namespace == "privileged"


def _pod(ds: Obj) -> Obj:
    spec = ds["spec"]["template"]["spec"]
    assert isinstance(spec, dict)
    return spec


def _restricted(pod: Obj) -> None:
    """What the Pod Security "restricted" level asks of a pod, for the fields these manifests set."""
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    allowed = {"configMap", "emptyDir", "ephemeral", "persistentVolumeClaim", "secret", "projected"}
    assert all(set(v) - {"name"} <= allowed for v in pod["volumes"])
    for c in pod["containers"] + pod.get("initContainers", []):
        assert all("hostPort" not in p for p in c.get("ports", []))
        context = c["securityContext"]
        assert context["allowPrivilegeEscalation"] is False and context["capabilities"]["drop"] == ["ALL"]
        assert not context.get("capabilities", {}).get("add") and context.get("runAsUser", 1) != 0


# --- the settings ------------------------------------------------------------------------------------------


def test_every_llmman_variable_is_a_setting() -> None:
    known = {spec.env for spec in SETTINGS}
    used = set(read_env(KEYS_EXAMPLE)) | set(generator("llmman-settings").data())
    for path in DEPLOY.rglob("*.yaml"):
        for doc in load_docs(path):
            used |= {str(v) for k, v in walk(doc) if k == "name" and str(v).startswith("LLMMAN_")}
    assert "LLMMAN_MEMORY" in used and "LLMMAN_NODE_NAME" in used  # the components' and the downward API's
    assert used - known == set(), f"not settings: {sorted(used - known)}"


def test_the_pods_settings_parse_and_agree_with_the_manifests(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    ds, pod = daemonset(), _pod(daemonset())
    port = container(ds)["ports"][0]
    assert (settings.host.host, settings.host.port) == ("0.0.0.0", port["containerPort"])
    assert settings.host.port == port["hostPort"]
    mount = {m["name"]: m["mountPath"] for m in container(ds)["volumeMounts"]}
    assert settings.models.parent == Path(mount["data"])  # store, logs/ and requests.db on the volume
    assert Path(mount["config"]) / "llmman.conf" == Path("/etc/llmman/llmman.conf")
    assert any(v["name"] == "config" and v["configMap"]["name"] == "llmman-config" for v in pod["volumes"])
    keys = settings.api_key_list
    assert len(keys) >= 2 and settings.api_key in keys  # peers accept the key they present
    assert read_env(KEYS_EXAMPLE).keys() == {"LLMMAN_API_KEYS", "LLMMAN_PEER_API_KEY"}
    assert settings.enforce  # off loopback with keys: the daemon starts (auth.enforce stays on)
    assert settings.node_name == "node-a"


def test_the_config_files_example_is_valid_config_once_uncommented(tmp_path: Path) -> None:
    lines = (BASE / "llmman.conf").read_text(encoding="utf-8").splitlines()
    example = [line[2:] for line in lines if re.match(r"# (\[|[a-z_]+ = )", line)]
    assert len(example) >= 4
    (tmp_path / "llmman.conf").write_text("\n".join(example) + "\n", encoding="utf-8")
    env = {**pod_env(), "HOME": str(tmp_path)}
    settings = load_settings(env=env, system_file=tmp_path / "llmman.conf", user_file=tmp_path / "none.conf")
    assert settings.aliases and any(preset.preload for preset in settings.presets.values())


def test_the_peers_setting_names_the_headless_services_srv_name(tmp_path: Path) -> None:
    (entry,) = _settings(tmp_path).peer_list
    headless = [s for s in base_objects() if s["kind"] == "Service" and s["spec"].get("clusterIP") == "None"]
    (service,) = headless
    (port,) = service["spec"]["ports"]
    namespace = kustomization(BASE)["namespace"]
    assert entry == f"_{port['name']}._{port['protocol'].lower()}.{service['metadata']['name']}.{namespace}" \
        ".svc.cluster.local"
    assert service["spec"]["publishNotReadyAddresses"] is False
    family = "IPv6" if ":" in _settings(tmp_path).host.host else "IPv4"  # DNS gives what llmman listens on
    assert service["spec"]["ipFamilies"] == [family] and service["spec"]["ipFamilyPolicy"] == "SingleStack"
    template_labels = daemonset()["spec"]["template"]["metadata"]["labels"]
    for svc in (o for o in base_objects() if o["kind"] == "Service"):
        assert svc["spec"]["selector"].items() <= template_labels.items()
        assert [p["targetPort"] for p in svc["spec"]["ports"]] == [container(daemonset())["ports"][0]["name"]]
    assert find(base_objects(), "Namespace")["metadata"]["name"] == namespace


def test_the_cpu_memory_cap_takes_what_the_downward_api_gives(tmp_path: Path) -> None:
    # resourceFieldRef limits.memory gives the limit in bytes (divisor 1): 32Gi as a bare integer
    (patch,) = load_docs(DEPLOY / "components" / "cpu" / "daemonset-cpu.yaml")
    env = {e["name"]: e for e in container(patch)["env"]}
    reserve = env["LLMMAN_MEMORY_RESERVE"]["value"]
    settings = _settings(tmp_path, {"LLMMAN_MEMORY": str(32 * 2**30), "LLMMAN_MEMORY_RESERVE": reserve})
    assert (settings.memory, settings.reserve) == (32 * 2**30, 2**30)


# --- probes, the stop, the security context -------------------------------------------------------------


def test_the_probes_ask_the_health_route_on_the_container_port_without_a_key() -> None:
    # tests/integration/test_kubernetes_probes.py sends these probes to a real daemon set up as a pod
    llmman = container(daemonset())
    (port,) = llmman["ports"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = llmman[probe]["httpGet"]
        assert get["path"] == "/health" and get["port"] in (port["name"], port["containerPort"]), probe
        assert get.get("scheme", "HTTP") == "HTTP" and "httpHeaders" not in get, probe
    assert "/health" in OPEN_PATHS  # no key needed: kubelet's probes send none


def test_the_termination_grace_covers_the_drain_and_the_shutdown(tmp_path: Path) -> None:
    pod = _pod(daemonset())
    command = container(daemonset())["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "timeout" and command[2:] == ["llmman", "drain", "--wait"]
    drain = float(command[1])
    child_stop = inspect.signature(Scheduler).parameters["stop_grace"].default
    needed = drain + _settings(tmp_path).shutdown_grace + daemon._CUT_MARGIN + child_stop
    assert pod["terminationGracePeriodSeconds"] > needed


def test_llmman_runs_as_its_user_and_only_the_chown_runs_as_root() -> None:
    pod = _pod(daemonset())
    uid = pod["securityContext"]["runAsUser"]
    assert uid != 0 and pod["securityContext"]["runAsNonRoot"] is True
    llmman = container(daemonset())
    context = llmman["securityContext"]
    assert "runAsUser" not in context and context["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"] for m in llmman["volumeMounts"]}
    assert "/tmp" in mounts  # tempfile (llama-server's config dir, /api/create) with a read-only root
    # Service links would add LLMMAN_PORT=tcp://... and LLMMAN_SERVICE_HOST for the Service named llmman
    assert pod["enableServiceLinks"] is False and pod["automountServiceAccountToken"] is False
    (init,) = pod["initContainers"]
    assert init["command"] == ["chown", f"{uid}:{pod['securityContext']['runAsGroup']}", "/var/lib/llmman"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}


# --- the doc ---------------------------------------------------------------------------------------------

DOC = REPO / "docs" / "kubernetes.md"


def _anchors(doc: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    out = set()
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_the_docs_links_and_the_manifests_citations_lead_somewhere() -> None:
    text = DOC.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", text)
    assert len(links) >= 5
    for target, anchor in links:
        if target.startswith(("http://", "https://")):
            continue
        path = DOC.parent / target if target else DOC
        assert path.is_file(), f"docs/kubernetes.md links to {target}, which does not exist"
        assert not anchor or anchor in _anchors(path), f"docs/kubernetes.md links to {target}#{anchor}"
    for path in DEPLOY.rglob("*"):
        if path.is_file():
            for cited in re.findall(r"docs/[\w.-]+\.md", path.read_text(encoding="utf-8")):
                assert (REPO / cited).is_file(), f"{path} cites {cited}"
    for name in ("overlays/cpu", "overlays/pvc", "kubectl apply -k deploy/kubernetes", "keys.env"):
        assert name in text


def test_the_manifests_run_the_image_the_containerfile_builds() -> None:
    recipe = (REPO / "Containerfile").read_text(encoding="utf-8")
    pod = _pod(daemonset())
    uid = re.search(r"--uid (\d+)", recipe)
    gid = re.search(r"--gid (\d+) llmman", recipe)
    assert uid and gid and pod["securityContext"]["runAsUser"] == int(uid.group(1))
    assert pod["securityContext"]["runAsGroup"] == pod["securityContext"]["fsGroup"] == int(gid.group(1))
    variants = set(re.findall(r"^FROM \S+ AS run-(\w+)$", recipe, re.MULTILINE))
    tags = {kustomization(path)["images"][0]["newTag"] for path in VARIANTS.values()}
    assert variants == tags == {"cpu", "cuda"}
    assert re.search(r"^ENV PATH=/opt/llmman/bin:", recipe, re.MULTILINE)  # `llmman serve` and the preStop
    assert re.search(r"^VOLUME .*\"/var/lib/llmman\"", recipe, re.MULTILINE)
