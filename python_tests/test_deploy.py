"""Kubernetes manifests: every overlay renders with `kubectl kustomize`, every object validates
(kubernetes-validate for built-in kinds, our own checks for CRDs), and serving invariants hold."""

import os
import shutil
import subprocess

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY = os.path.join(ROOT, "deploy")
OVERLAYS = ["h100", "b200", "multinode", "router", "autoscaling"]
K8S_VERSION = "1.32.0"
CRDS = {"ServiceMonitor", "LeaderWorkerSet", "ScaledObject"}


def render(path):
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (with built-in kustomize) is required to render deploy/"
    p = subprocess.run([kubectl, "kustomize", path], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return [d for d in yaml.safe_load_all(p.stdout) if d]


RENDERED = {
    name: render(os.path.join(DEPLOY, "base" if name == "base" else f"overlays/{name}")) for name in ["base", *OVERLAYS]
}


def pod_specs(objs):
    for o in objs:
        if o["kind"] == "Deployment":
            yield o["metadata"]["name"], o["spec"]["template"]["spec"]
        if o["kind"] == "LeaderWorkerSet":
            t = o["spec"]["leaderWorkerTemplate"]
            yield o["metadata"]["name"] + "/leader", t["leaderTemplate"]["spec"]
            yield o["metadata"]["name"] + "/worker", t["workerTemplate"]["spec"]


def servers(objs):
    """Pod specs running the SGLang server (not the router)."""
    return [
        (n, s)
        for n, s in pod_specs(objs)
        if any("--speculative-algorithm=DFLASH" in c.get("args", []) for c in s["containers"])
    ]


def config(objs):
    return next(o["data"] for o in objs if o["kind"] == "ConfigMap")


@pytest.mark.parametrize("name", ["base", *OVERLAYS])
def test_builtin_kinds_validate(name):
    import kubernetes_validate

    for o in RENDERED[name]:
        if o["kind"] in CRDS:
            continue
        kubernetes_validate.validate(o, K8S_VERSION, strict=True)


@pytest.mark.parametrize("name", ["base", *OVERLAYS])
def test_crds_have_required_fields(name):
    for o in RENDERED[name]:
        spec = o.get("spec", {})
        if o["kind"] == "ServiceMonitor":
            assert o["apiVersion"] == "monitoring.coreos.com/v1"
            assert spec["selector"]["matchLabels"] and spec["endpoints"][0]["path"] == "/metrics"
        elif o["kind"] == "LeaderWorkerSet":
            assert o["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
            lwt = spec["leaderWorkerTemplate"]
            assert lwt["size"] >= 2 and lwt["leaderTemplate"]["spec"]["containers"]
        elif o["kind"] == "ScaledObject":
            assert o["apiVersion"] == "keda.sh/v1alpha1"
            names = {x["metadata"]["name"] for x in RENDERED[name] if x["kind"] == "Deployment"}
            assert spec["scaleTargetRef"]["name"] in names
            assert spec["minReplicaCount"] >= 1 and spec["triggers"][0]["metadata"]["query"]


@pytest.mark.parametrize("name", ["base", *OVERLAYS])
def test_serving_invariants(name):
    objs = RENDERED[name]
    srv = servers(objs)
    assert srv, "no DFLASH server pod"
    cfg = config(objs)
    tp = int(cfg["TP_SIZE"])
    nodes = next((o["spec"]["leaderWorkerTemplate"]["size"] for o in objs if o["kind"] == "LeaderWorkerSet"), 1)
    for pod, spec in srv:
        c = spec["containers"][0]
        args = c["args"]
        assert "--speculative-draft-model-path=$(DRAFT_MODEL_PATH)" in args and cfg["DRAFT_MODEL_PATH"]
        assert "--tp-size=$(TP_SIZE)" in args and "--enable-metrics" in args
        gpus = int(c["resources"]["limits"]["nvidia.com/gpu"])
        assert gpus * nodes == tp, f"{pod}: {gpus} GPUs x {nodes} nodes != TP {tp}"
        assert c["startupProbe"]["httpGet"]["path"] == "/health_generate"
        assert c["readinessProbe"]["httpGet"]["path"] == "/health_generate"
        assert c["livenessProbe"]["httpGet"]["path"] == "/health"
        shm = [v for v in spec["volumes"] if v["name"] == "shm"]
        assert shm and shm[0]["emptyDir"]["medium"] == "Memory"
        assert {"name": "shm", "mountPath": "/dev/shm"} in c["volumeMounts"]
        assert spec["securityContext"]["runAsNonRoot"] is True
    for _, spec in pod_specs(objs):
        for c in spec["containers"]:
            image = c["image"]
            assert ":" in image and not image.endswith(":latest"), image


@pytest.mark.parametrize(
    "name,product", [("h100", "NVIDIA-H100-80GB-HBM3"), ("b200", "NVIDIA-B200"), ("multinode", "NVIDIA-H100-80GB-HBM3")]
)
def test_gpu_overlays_pick_their_gpu(name, product):
    for _, spec in servers(RENDERED[name]):
        assert spec["nodeSelector"]["nvidia.com/gpu.product"] == product
        assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])


def strip(o):
    return {k: v for k, v in o.items() if k != "status"}


@pytest.mark.parametrize(
    "name,allowed",
    [
        ("h100", {"Deployment"}),
        ("b200", {"Deployment"}),
        ("multinode", {"Deployment", "LeaderWorkerSet", "ConfigMap"}),
        ("router", {"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding"}),
        ("autoscaling", {"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding", "ScaledObject"}),
    ],
)
def test_overlays_differ_only_where_they_must(name, allowed):
    base = {(o["kind"], o["metadata"]["name"]): strip(o) for o in RENDERED["base"]}
    over = {(o["kind"], o["metadata"]["name"]): strip(o) for o in RENDERED[name]}
    changed = {k[0] for k in set(base) | set(over) if base.get(k) != over.get(k)}
    assert changed <= allowed, changed - allowed
    assert changed, "overlay changes nothing"


def test_dockerfile_pins_sglang_and_builds_cuda():
    text = open(os.path.join(DEPLOY, "Dockerfile")).read()
    assert "FROM lmsysorg/sglang:v0.5.23" in text and "9.0;10.0" in text and "USER 1000" in text


def test_router_overlay_runs_smg_with_the_local_router_flags():
    """The router Deployment runs SMG (not the retired sglang-router) with service discovery of the
    DFLASH pods and the flags `make serve REPLICAS=N` gives it; the image installs the pinned SMG;
    every replica labels its metric series with its pod name."""
    from sglang_dflash.replicas import router_cmd

    router = next(
        o for o in RENDERED["router"] if o["kind"] == "Deployment" and o["metadata"]["name"] == "sglang-dflash-router"
    )
    c = router["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["smg", "launch"]
    args = c["args"]
    assert "--service-discovery" in args and "app.kubernetes.io/name=sglang-dflash" in args
    local = router_cmd(["http://w:1"], "h", 1, 2)
    for flag in ("--policy", "--health-check-interval-secs", "--health-failure-threshold"):
        assert args[args.index(flag) + 1] == local[local.index(flag) + 1], flag
    assert "--disable-worker-overload-protection" in args and "--disable-worker-overload-protection" in local
    assert "smg==1.13.0" in open(os.path.join(DEPLOY, "Dockerfile")).read()
    for _, spec in servers(RENDERED["base"]):
        sv = spec["containers"][0]
        assert any(a.startswith("--extra-metric-labels=") and "$(POD_NAME)" in a for a in sv["args"])
        assert any(e["name"] == "POD_NAME" for e in sv["env"])


def env_value(container, name):
    return next((e for e in container.get("env", []) if e["name"] == name), None)


@pytest.mark.parametrize("name", ["base", *OVERLAYS])
def test_pods_drain_within_their_grace_period(name):
    """SIGTERM drains (srt/drain.py): the pod's grace period covers preStop's sleep, the drain
    (SGLANG_DFLASH_DRAIN_S) and SGLang's shutdown after it (schedulers get up to 15 s, then more)."""
    for pod, spec in servers(RENDERED[name]):
        c = spec["containers"][0]
        sleep = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
        drain = int(env_value(c, "SGLANG_DFLASH_DRAIN_S")["value"])
        assert sleep >= 5, f"{pod}: preStop sleeps {sleep} s; SMG and the Service need a few to drop the pod"
        assert spec["terminationGracePeriodSeconds"] >= sleep + drain + 30, pod


@pytest.mark.parametrize("name", ["base", *OVERLAYS])
def test_pods_take_the_api_key_from_a_secret_and_run_read_only(name):
    """Every server passes SGLang's --api-key, SMG its own (the key it sends to the workers), both from
    the one Secret; every container runs as non-root on a read-only root with writable emptyDirs."""
    for pod, spec in pod_specs(RENDERED[name]):
        c = spec["containers"][0]
        is_server = any("--speculative-algorithm=DFLASH" in a for a in c.get("args", []))
        if is_server or c.get("command") == ["smg", "launch"]:
            assert "--api-key=$(API_KEY)" in c["args"], pod
            ref = env_value(c, "API_KEY")["valueFrom"]["secretKeyRef"]
            assert ref == {"name": "sglang-dflash-api-key", "key": "api-key"}, pod  # required: no optional
        assert spec["securityContext"]["runAsNonRoot"] is True, pod
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, pod
        empty = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        needed = ["/tmp", "/home/sglang/.cache", "/dev/shm"] if is_server else ["/tmp"]
        for path in needed:
            assert mounts.get(path) in empty, f"{pod}: {path} must be a writable emptyDir on a read-only root"
