"""Offline checks of the Kubernetes manifests in deploy/k8s.

Every built-in object validates (strictly: unknown fields fail) against the Kubernetes 1.30 OpenAPI
schemas that PyPI's `kubernetes-validate` bundles. KEDA ScaledObjects have no bundled schema; they
get a structural check instead. No cluster, no network.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S_DIR = REPO / "deploy" / "k8s"
K8S_VERSION = "1.30.0"

WORKERS = ("retrieval-worker", "generation-worker", "callbacks-worker")
WORKER_METRICS_PORT = 9100
METRICS_URL = f"http://127.0.0.1:{WORKER_METRICS_PORT}/metrics"
# Objects that come from CRDs or tools, not from the Kubernetes API itself.
NON_CORE_API_GROUPS = ("keda.sh/", "kustomize.config.k8s.io/")


def _load_docs() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S_DIR.glob("*.yaml")):
        with path.open(encoding="utf-8") as fh:
            for doc in yaml.safe_load_all(fh):
                if doc:
                    docs.append((path.name, doc))
    return docs


DOCS = _load_docs()
CORE_DOCS = [(f, d) for f, d in DOCS if not d["apiVersion"].startswith(NON_CORE_API_GROUPS)]
SCALED_OBJECTS = [d for _, d in DOCS if d["kind"] == "ScaledObject"]


def _objects(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in DOCS if d["kind"] == kind}


def _doc_id(item: tuple[str, dict[str, Any]]) -> str:
    file, doc = item
    return f"{file}:{doc['kind']}/{doc['metadata']['name']}"


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, "one process per pod: one container"
    return containers[0]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _configmap_env() -> dict[str, str]:
    return _objects("ConfigMap")["ragline-env"]["data"]


def _exec_cmd(probe: dict[str, Any]) -> str:
    assert "exec" in probe, f"expected an exec probe, got {probe}"
    return " ".join(probe["exec"]["command"])


# -- schema validation ----------------------------------------------------------------------


def test_manifests_found() -> None:
    assert CORE_DOCS, f"no manifests under {K8S_DIR}"


@pytest.mark.parametrize("item", CORE_DOCS, ids=_doc_id)
def test_manifest_validates_against_kubernetes_schema(item: tuple[str, dict[str, Any]]) -> None:
    _, doc = item
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        pytest.fail(
            f"{_doc_id(item)} invalid for Kubernetes {K8S_VERSION} at {where}: {exc.message}", pytrace=False
        )
    except kubernetes_validate.SchemaNotFoundError as exc:
        pytest.fail(exc.message, pytrace=False)


def test_no_namespace_in_manifests() -> None:
    # kustomization.yaml sets it; a hard-coded one would silently win over an overlay's.
    pinned = [_doc_id((f, d)) for f, d in DOCS if d.get("metadata", {}).get("namespace")]
    assert not pinned, f"manifests pin a namespace: {pinned}"


def test_kustomization_lists_every_manifest() -> None:
    with (K8S_DIR / "kustomization.yaml").open(encoding="utf-8") as fh:
        kustomization = yaml.safe_load(fh)
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    assert kustomization["namespace"] == "ragline"
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed)), "a resource is listed twice"
    on_disk = {p.name for p in K8S_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(listed) == on_disk, (
        f"not in kustomization.yaml: {sorted(on_disk - set(listed))}; "
        f"listed but missing: {sorted(set(listed) - on_disk)}"
    )
    assert not list(K8S_DIR.glob("*.yml")), "use .yaml"


# -- wiring ---------------------------------------------------------------------------------


def test_expected_objects_present() -> None:
    assert {"api", "flower", *WORKERS} <= set(_objects("Deployment"))
    assert {"api", "flower", "redis", *WORKERS} <= set(_objects("Service"))
    assert {"api", *WORKERS} <= set(_objects("PodDisruptionBudget"))
    assert "redis" in _objects("StatefulSet")
    assert "ragline-env" in _objects("ConfigMap")
    assert "ragline-data" in _objects("PersistentVolumeClaim")
    assert not _objects("Ingress"), "nothing here is exposed outside the cluster"


def _workload_labels() -> list[dict[str, str]]:
    workloads = {**_objects("Deployment"), **_objects("StatefulSet")}
    return [w["spec"]["template"]["metadata"]["labels"] for w in workloads.values()]


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_workload_selectors_match_their_pods() -> None:
    for name, workload in {**_objects("Deployment"), **_objects("StatefulSet")}.items():
        selector = workload["spec"]["selector"]["matchLabels"]
        assert _matches(selector, workload["spec"]["template"]["metadata"]["labels"]), name
        # Selectors of two workloads must not overlap (a Deployment would adopt the other's pods).
        others = [w for n, w in {**_objects("Deployment"), **_objects("StatefulSet")}.items() if n != name]
        for other in others:
            assert not _matches(selector, other["spec"]["template"]["metadata"]["labels"]), (
                f"{name}'s selector also selects {other['metadata']['name']}'s pods"
            )


def test_services_select_pods_and_named_ports() -> None:
    workloads = {**_objects("Deployment"), **_objects("StatefulSet")}
    for name, service in _objects("Service").items():
        selector = service["spec"]["selector"]
        targets = [
            w for w in workloads.values() if _matches(selector, w["spec"]["template"]["metadata"]["labels"])
        ]
        assert len(targets) == 1, f"Service {name} selects {len(targets)} workloads"
        ports = {p["name"]: p["containerPort"] for p in _container(targets[0]).get("ports", [])}
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            assert target in ports or target in ports.values(), f"Service {name}: no container port {target}"


def test_pdbs_cover_api_and_every_worker() -> None:
    deployments = _objects("Deployment")
    for name, pdb in _objects("PodDisruptionBudget").items():
        selector = pdb["spec"]["selector"]["matchLabels"]
        assert _matches(selector, deployments[name]["spec"]["template"]["metadata"]["labels"]), name
        # maxUnavailable stays valid at any replica count KEDA picks; minAvailable: 1 on a
        # one-replica tier would block every node drain.
        assert pdb["spec"].get("maxUnavailable") == 1, name


def test_redis_url_points_at_the_redis_service() -> None:
    url = _configmap_env()["RAGLINE_REDIS_URL"]
    host = re.match(r"redis://([^:/]+)", url)
    assert host, url
    assert host.group(1) in _objects("Service")


def test_redis_persists_with_aof_and_never_evicts() -> None:
    redis = _objects("StatefulSet")["redis"]
    args = _container(redis)["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    assert redis["spec"]["volumeClaimTemplates"], "Redis data must outlive the pod"
    text = (K8S_DIR / "redis.yaml").read_text(encoding="utf-8")
    assert "managed Redis" in text
    assert "Sentinel" in text


def test_data_volume_is_read_write_many() -> None:
    pvc = _objects("PersistentVolumeClaim")["ragline-data"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    for name in ("retrieval-worker", "generation-worker"):
        spec = _objects("Deployment")[name]["spec"]["template"]["spec"]
        claims = [
            v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v
        ]
        assert claims == ["ragline-data"], name
        mounts = {m["mountPath"] for m in _container(_objects("Deployment")[name])["volumeMounts"]}
        assert _configmap_env()["RAGLINE_HOME"] in mounts, name


def test_every_ragline_container_reads_the_common_configmap() -> None:
    for name, deployment in _objects("Deployment").items():
        refs = [e["configMapRef"]["name"] for e in _container(deployment).get("envFrom", [])]
        assert "ragline-env" in refs, name


# -- API ------------------------------------------------------------------------------------


def test_api_probes_and_graceful_shutdown() -> None:
    api = _objects("Deployment")["api"]
    container = _container(api)
    assert container["command"] == ["ragline", "api"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep", "the API sleeps first so endpoints deregister before it stops"
    sleep_s = int(pre_stop[1])
    grace = api["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > sleep_s + 10, "grace must cover the preStop sleep and uvicorn's 10 s drain"
    annotations = api["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "8000"
    assert annotations["prometheus.io/path"] == "/metrics"


# -- workers --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", WORKERS)
def test_worker_command_metrics_port_and_probes(name: str) -> None:
    deployment = _objects("Deployment")[name]
    container = _container(deployment)
    assert container["command"] == ["ragline", "worker", name.removesuffix("-worker")]
    assert _env(container)["RAGLINE_WORKER_METRICS_PORT"] == str(WORKER_METRICS_PORT)
    assert {"name": "metrics", "containerPort": WORKER_METRICS_PORT} in container["ports"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(WORKER_METRICS_PORT)
    for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
        cmd = _exec_cmd(container[kind])
        assert METRICS_URL in cmd, f"{name} {kind} must check the worker's metrics port: {cmd}"
        # A Celery broadcast through Redis on every probe of every pod is what this avoids.
        assert "inspect" not in cmd, f"{name} {kind}: no `celery inspect ping` probes"
        assert container[kind]["timeoutSeconds"] >= 3, f"{name} {kind}: timeout below the urlopen timeout"


@pytest.mark.parametrize("name", WORKERS)
def test_worker_grace_lets_tasks_finish_before_redelivery(name: str) -> None:
    grace = _objects("Deployment")[name]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    visibility = int(_configmap_env()["RAGLINE_VISIBILITY_TIMEOUT_S"])
    assert 0 < grace < visibility, f"{name}: grace {grace}s must end before visibility_timeout {visibility}s"


def test_generation_worker_one_engine_per_gpu() -> None:
    deployment = _objects("Deployment")["generation-worker"]
    container = _container(deployment)
    resources = container["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == 1
    assert resources["limits"]["nvidia.com/gpu"] == 1
    assert container["image"].endswith(":gpu")
    assert int(_env(container)["RAGLINE_MAX_NUM_SEQS"]) > 0
    spec = deployment["spec"]
    # Covers the longest generation: RAGLINE_GENERATION_TIMEOUT_S plus the engine shutdown.
    grace = spec["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= 180
    assert grace > int(_configmap_env()["RAGLINE_GENERATION_TIMEOUT_S"]) + 30
    # A new revision never lowers capacity: the new pod's engine must be ready first.
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    shm = [v for v in spec["template"]["spec"]["volumes"] if v["name"] == "dshm"]
    assert shm and shm[0]["emptyDir"]["medium"] == "Memory"


def test_keda_targets_set_no_replicas() -> None:
    for so in SCALED_OBJECTS:
        target = _objects("Deployment")[so["spec"]["scaleTargetRef"]["name"]]
        assert "replicas" not in target["spec"], (
            f"{target['metadata']['name']} is scaled by KEDA; a fixed replicas is reset on every apply"
        )


# -- Flower ---------------------------------------------------------------------------------


def test_flower_is_internal_authenticated_and_stops_on_sigint() -> None:
    service = _objects("Service")["flower"]
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert all("nodePort" not in p for p in service["spec"]["ports"])
    container = _container(_objects("Deployment")["flower"])
    env = _env(container)
    for key in ("RAGLINE_FLOWER_USER", "RAGLINE_FLOWER_PASSWORD"):
        ref = env[key]["secretKeyRef"]
        assert ref["key"] == key
        assert not ref.get("optional", False), (
            "without the Secret Flower must not start (no default password)"
        )
    assert "FLOWER_BASIC_AUTH" not in " ".join(container.get("command", []) + container.get("args", []))
    pre_stop = " ".join(container["lifecycle"]["preStop"]["exec"]["command"])
    assert "SIGINT" in pre_stop, "Flower ignores SIGTERM"


def test_flower_network_policy_admits_only_this_namespace() -> None:
    flower_labels = _objects("Deployment")["flower"]["spec"]["template"]["metadata"]["labels"]
    policies = [
        p
        for p in _objects("NetworkPolicy").values()
        if _matches(p["spec"]["podSelector"]["matchLabels"], flower_labels)
    ]
    assert len(policies) == 1
    spec = policies[0]["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    for rule in spec["ingress"]:
        assert rule["from"], "an empty `from` admits everyone"
        for peer in rule["from"]:
            assert set(peer) == {"podSelector"}, f"peer reaches outside the namespace: {peer}"
    text = (K8S_DIR / "flower.yaml").read_text(encoding="utf-8")
    assert "/metrics" in text and "basic auth" in text, "say why: /metrics is not behind basic auth"


# -- KEDA -----------------------------------------------------------------------------------


def _exported_metric_names() -> set[str]:
    from prometheus_client import REGISTRY

    import broker.metrics  # noqa: F401  (registers every ragline metric)

    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}
    names: set[str] = set()
    for family in REGISTRY.collect():
        if family.name.startswith("ragline_"):
            names.update(family.name + s for s in suffixes.get(family.type, ("",)))
            names.update(sample.name for sample in family.samples)
    return names


def test_scaled_objects_structure() -> None:
    assert {so["metadata"]["name"] for so in SCALED_OBJECTS} >= {"generation-worker", "retrieval-worker"}
    deployments = _objects("Deployment")
    exported = _exported_metric_names()
    for so in SCALED_OBJECTS:
        name = so["metadata"]["name"]
        assert so["apiVersion"] == "keda.sh/v1alpha1", name
        spec = so["spec"]
        ref = spec["scaleTargetRef"]
        assert ref.get("kind", "Deployment") == "Deployment", name
        assert ref["name"] in deployments, f"{name} scales a Deployment that does not exist: {ref['name']}"
        assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"], name
        assert spec["triggers"], name
        for trigger in spec["triggers"]:
            assert trigger["type"] == "prometheus", (
                f"{name}: queue depth comes from Prometheus, not redis-lists"
            )
            assert trigger.get("metricType", "AverageValue") in {"AverageValue", "Value"}
            meta = trigger["metadata"]
            assert meta["serverAddress"].startswith("http"), name
            float(meta["threshold"])  # a number, as a string
            assert all(isinstance(v, str) for v in meta.values()), (
                f"{name}: trigger metadata values are strings"
            )
            used = set(re.findall(r"\bragline_[a-zA-Z0-9_]+", meta["query"]))
            assert used, f"{name}: query reads no ragline metric: {meta['query']}"
            assert used <= exported, f"{name}: not exported by broker.metrics: {sorted(used - exported)}"
        if "fallback" in spec:
            # KEDA supports fallback only when every trigger is AverageValue.
            assert all(t.get("metricType", "AverageValue") == "AverageValue" for t in spec["triggers"]), name


def _query(so: dict[str, Any], fragment: str) -> dict[str, Any]:
    found = [t for t in so["spec"]["triggers"] if fragment in t["metadata"]["query"]]
    assert len(found) == 1, f"{so['metadata']['name']}: expected one trigger reading {fragment}"
    return found[0]


def test_generation_scales_on_p99_and_queue_depth() -> None:
    so = {s["metadata"]["name"]: s for s in SCALED_OBJECTS}["generation-worker"]
    latency = _query(so, 'ragline_request_seconds_bucket{mode="rag"}')
    compact = re.sub(r"\s+", "", latency["metadata"]["query"])
    assert (
        'histogram_quantile(0.99,sum(rate(ragline_request_seconds_bucket{mode="rag"}[1m]))by(le))' in compact
    )
    assert float(latency["metadata"]["threshold"]) == 0.5
    # P99 is not a per-pod quantity: scale by the ratio to the target, not by value / pods.
    assert latency["metricType"] == "Value"
    depth = _query(so, 'ragline_queue_depth{queue="generation"}')
    assert depth.get("metricType", "AverageValue") == "AverageValue"
    max_num_seqs = int(_env(_container(_objects("Deployment")["generation-worker"]))["RAGLINE_MAX_NUM_SEQS"])
    assert float(depth["metadata"]["threshold"]) == max_num_seqs, "target one full engine batch per pod"

    behavior = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    up = behavior["scaleUp"]
    assert up["stabilizationWindowSeconds"] == 30
    assert up["policies"] == [{"type": "Pods", "value": 2, "periodSeconds": 30}]
    down = behavior["scaleDown"]
    assert down["stabilizationWindowSeconds"] == 600
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 300}]


def test_retrieval_scales_on_queue_depth() -> None:
    so = {s["metadata"]["name"]: s for s in SCALED_OBJECTS}["retrieval-worker"]
    depth = _query(so, 'ragline_queue_depth{queue="retrieval"}')
    assert depth.get("metricType", "AverageValue") == "AverageValue"
    assert float(depth["metadata"]["threshold"]) > 0
