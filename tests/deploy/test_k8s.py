"""Offline checks of the Kubernetes manifests in deploy/k8s.

Every built-in object validates (strictly: unknown fields fail) against the Kubernetes 1.30 OpenAPI
schemas that PyPI's `kubernetes-validate` bundles. KEDA ScaledObjects have no bundled schema; they
get a structural check instead. No cluster, no network.

The shard-group component (deploy/k8s/components/shards) is checked with the base, as the objects
are with it enabled; its patch of the base retrieval workers is checked on its own.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from ragline.broker.contract.queues import RETRIEVAL_QUEUE
from ragline.broker.state import shards

REPO = Path(__file__).resolve().parents[2]
K8S_DIR = REPO / "deploy" / "k8s"
SHARDS_DIR = K8S_DIR / "components" / "shards"
K8S_VERSION = "1.30.0"

WORKERS = ("retrieval-worker", "generation-worker", "callbacks-worker", "ingest-worker")
SHARD_GROUPS = ("retrieval-shards-a",)
SECRET = "ragline-secrets"  # created by hand (docs/operations.md), never in this repository
NAMESPACE = "ragline"
WORKER_METRICS_PORT = 9100
METRICS_URL = f"http://127.0.0.1:{WORKER_METRICS_PORT}/metrics"
# Objects that come from CRDs or tools, not from the Kubernetes API itself.
NON_CORE_API_GROUPS = ("keda.sh/", "kustomize.config.k8s.io/")


def _load(path: Path) -> list[tuple[str, dict[str, Any]]]:
    with path.open(encoding="utf-8") as fh:
        return [(str(path.relative_to(K8S_DIR)), doc) for doc in yaml.safe_load_all(fh) if doc]


def _shards_component() -> dict[str, Any]:
    with (SHARDS_DIR / "kustomization.yaml").open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _load_docs() -> list[tuple[str, dict[str, Any]]]:
    docs = [doc for path in sorted(K8S_DIR.glob("*.yaml")) for doc in _load(path)]
    for name in _shards_component()["resources"]:
        docs += _load(SHARDS_DIR / name)
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


def _ragline_containers() -> dict[str, dict[str, Any]]:
    workloads = {**_objects("Deployment"), **_objects("StatefulSet")}
    return {name: _container(w) for name, w in workloads.items()}


def test_every_ragline_pod_logs_in_to_redis_with_the_secret_password() -> None:
    """RAGLINE_REDIS_URL carries the ACL user and the password from the Secret, expanded by
    Kubernetes from a variable defined before it, and names the redis Service."""
    assert "RAGLINE_REDIS_URL" not in _configmap_env(), "a URL with a password belongs in no ConfigMap"
    for name, deployment in _objects("Deployment").items():
        env = _container(deployment)["env"]
        names = [e["name"] for e in env]
        password = env[names.index("RAGLINE_REDIS_PASSWORD")]
        assert password["valueFrom"]["secretKeyRef"] == {"name": SECRET, "key": "RAGLINE_REDIS_PASSWORD"}, (
            name
        )
        url = env[names.index("RAGLINE_REDIS_URL")]
        assert names.index("RAGLINE_REDIS_PASSWORD") < names.index("RAGLINE_REDIS_URL"), (
            f"{name}: $(RAGLINE_REDIS_PASSWORD) expands only from a variable defined before it"
        )
        match = re.fullmatch(r"redis://ragline:\$\(RAGLINE_REDIS_PASSWORD\)@([^:/]+):6379/0", url["value"])
        assert match, f"{name}: {url['value']}"
        assert match.group(1) in _objects("Service")


def test_redis_requires_a_password() -> None:
    container = _container(_objects("StatefulSet")["redis"])
    args = container["args"]
    users = [" ".join(args[i + 1 : i + 3]) for i, a in enumerate(args) if a == "--user"]
    assert "default off" in users, "anonymous clients must be refused"
    ragline = args[args.index("ragline", args.index("--user")) : args.index("ragline") + 6]
    assert ragline == ["ragline", "on", ">$(RAGLINE_REDIS_PASSWORD)", "~*", "&*", "+@all"], ragline
    env = _env(container)
    for key in ("RAGLINE_REDIS_PASSWORD", "REDISCLI_AUTH"):
        assert env[key]["secretKeyRef"] == {"name": SECRET, "key": "RAGLINE_REDIS_PASSWORD"}, key
    for kind in ("readinessProbe", "livenessProbe"):
        # redis-cli exits 0 on NOAUTH: only the PONG says the probe got in.
        assert "redis-cli --user ragline ping | grep -q PONG" in _exec_cmd(container[kind]), kind


# RAGLINE_WEBHOOK_SECRET, *_PASSWORD, REDISCLI_AUTH, FLOWER_BASIC_AUTH, *_TOKEN (not
# TOKENIZERS_PARALLELISM, RAGLINE_AUTH_ENABLED).
_SECRET_NAME = re.compile(r"(SECRET|PASSWORD|TOKEN)(_|$)|_AUTH$")


def test_every_secret_comes_from_a_secret() -> None:
    """Nothing secret is written in a manifest: every such variable comes from a Secret that must
    exist (not optional), and no ConfigMap value carries one."""
    for name, container in _ragline_containers().items():
        env = container.get("env", [])
        defined: list[str] = []
        for entry in env:
            if _SECRET_NAME.search(entry["name"]):
                ref = entry.get("valueFrom", {}).get("secretKeyRef")
                assert ref and "value" not in entry, f"{name}: {entry['name']} is not taken from a Secret"
                assert not ref.get("optional", False), f"{name}: {entry['name']} must not start without it"
            for used in re.findall(r"\$\(([A-Z0-9_]+)\)", entry.get("value", "")):
                assert used in defined, f"{name}: {entry['name']} uses $({used}) before it is defined"
            defined.append(entry["name"])
        assert all("secretRef" not in ref for ref in container.get("envFrom", [])), name
    for key, value in _configmap_env().items():
        assert not _SECRET_NAME.search(key), key
        assert not re.search(r"://[^/\s]*@", value), f"{key} carries credentials"


@pytest.mark.parametrize("name", ["api", "callbacks-worker"])
def test_the_webhook_secret_comes_from_the_secret(name: str) -> None:
    """The callbacks worker signs with it and the API checks it: both refuse the public default,
    so both must get the real one."""
    env = _env(_container(_objects("Deployment")[name]))
    assert env["RAGLINE_WEBHOOK_SECRET"]["secretKeyRef"] == {"name": SECRET, "key": "RAGLINE_WEBHOOK_SECRET"}


def test_operations_docs_create_every_secret_the_manifests_read() -> None:
    refs: dict[str, set[str]] = {}
    for container in _ragline_containers().values():
        for entry in container.get("env", []):
            ref = entry.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                refs.setdefault(ref["name"], set()).add(ref["key"])
    docs = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    for secret, keys in refs.items():
        command = docs.split(f"create secret generic {secret}", 1)
        assert len(command) == 2, f"docs/operations.md does not create the Secret {secret}"
        block = command[1].split("\n\n", 1)[0]
        for key in keys:
            assert f"--from-literal={key}=" in block, f"{secret}: {key} is not created in the docs"


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
    # The API stages uploads there; the ingest worker writes index versions.
    for name in ("retrieval-worker", "generation-worker", "ingest-worker", "api"):
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
def test_worker_command(name: str) -> None:
    container = _container(_objects("Deployment")[name])
    assert container["command"] == ["ragline", "worker", name.removesuffix("-worker")]


@pytest.mark.parametrize("name", WORKERS + SHARD_GROUPS)
def test_worker_metrics_port_and_probes(name: str) -> None:
    deployment = _objects("Deployment")[name]
    container = _container(deployment)
    assert _env(container)["RAGLINE_WORKER_METRICS_PORT"] == str(WORKER_METRICS_PORT)
    # Loopback is the default; Prometheus scrapes the pod's address (the NetworkPolicy guards it).
    assert _env(container)["RAGLINE_WORKER_METRICS_HOST"] == "0.0.0.0"
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


@pytest.mark.parametrize("name", WORKERS + SHARD_GROUPS)
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


def test_generation_defaults_come_from_the_pods_gpu() -> None:
    container = _container(_objects("Deployment")["generation-worker"])
    env = _env(container)
    # Chosen in the pod from its GPU (and logged): nothing from one development box.
    for name in (
        "RAGLINE_DTYPE",
        "RAGLINE_GPU_MEMORY_UTILIZATION",
        "RAGLINE_KV_BLOCK_SIZE",
        "RAGLINE_ENFORCE_EAGER",
    ):
        assert name not in env and name not in _configmap_env(), name
    assert not any(k.startswith("VLLM_CPU_") for k in env)
    # One engine over the pod's GPUs: as many as it gets.
    assert int(env["RAGLINE_TENSOR_PARALLEL"]) == container["resources"]["limits"]["nvidia.com/gpu"]


def test_keda_scales_generation_on_its_queue_one_full_batch_per_pod() -> None:
    so = next(s for s in SCALED_OBJECTS if s["spec"]["scaleTargetRef"]["name"] == "generation-worker")
    depth = next(t for t in so["spec"]["triggers"] if t["name"] == "generation-queue-depth")
    assert depth["metadata"]["query"] == 'max(ragline_queue_depth{queue="generation"})'
    assert depth["metricType"] == "AverageValue"
    seqs = _env(_container(_objects("Deployment")["generation-worker"]))["RAGLINE_MAX_NUM_SEQS"]
    assert depth["metadata"]["threshold"] == seqs


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
        if p["spec"].get("ingress") and _selects(p["spec"]["podSelector"], flower_labels)
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
    assert _env(_container(_objects("Deployment")["flower"]))["RAGLINE_FLOWER_ADDRESS"] == "0.0.0.0"


# -- NetworkPolicy: evaluated as Kubernetes does, for pods of every kind ----------------------


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (matchLabels and matchExpressions); an empty one selects everything."""
    if not _matches(selector.get("matchLabels", {}), labels):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if (
            (op == "In" and labels.get(key) not in values)
            or (op == "NotIn" and key in labels and labels[key] in values)
            or (op == "Exists" and key not in labels)
            or (op == "DoesNotExist" and key in labels)
        ):
            return False
    return True


def _peer_admits(peer: dict[str, Any], labels: dict[str, str], namespace: str) -> bool:
    if "ipBlock" in peer:
        return False  # nothing here is reached by address
    ns_labels = {"kubernetes.io/metadata.name": namespace}
    in_ns = (
        _selects(peer["namespaceSelector"], ns_labels)
        if "namespaceSelector" in peer
        else namespace == NAMESPACE
    )
    return in_ns and _selects(peer.get("podSelector", {}), labels)


def _admitted(labels: dict[str, str], dest: dict[str, str], port: int, namespace: str = NAMESPACE) -> bool:
    """Whether a pod with ``labels`` in ``namespace`` may open ``port`` on a ragline pod ``dest``."""
    policies = [
        p["spec"]
        for p in _objects("NetworkPolicy").values()
        if "Ingress" in p["spec"]["policyTypes"] and _selects(p["spec"]["podSelector"], dest)
    ]
    if not policies:
        return True
    for spec in policies:
        for rule in spec.get("ingress", []):
            ports = rule.get("ports")
            if ports and not any(p.get("protocol", "TCP") == "TCP" and p.get("port") == port for p in ports):
                continue
            peers = rule.get("from")
            if not peers or any(_peer_admits(peer, labels, namespace) for peer in peers):
                return True
    return False


def _pod_labels(name: str) -> dict[str, str]:
    workloads = {**_objects("Deployment"), **_objects("StatefulSet")}
    return workloads[name]["spec"]["template"]["metadata"]["labels"]


INTRUDER = {"app": "intruder"}
PROMETHEUS = {"app.kubernetes.io/name": "prometheus"}


def test_default_deny_selects_every_pod() -> None:
    deny = [
        p["spec"]
        for p in _objects("NetworkPolicy").values()
        if p["spec"]["podSelector"] == {}
        and p["spec"]["policyTypes"] == ["Ingress"]
        and not p["spec"].get("ingress")
    ]
    assert len(deny) == 1, "one default-deny ingress policy for the namespace"
    assert not _admitted(INTRUDER, {"app": "anything-added-later"}, 80)


def test_redis_admits_only_ragline_pods() -> None:
    redis = _pod_labels("redis")
    for name in _objects("Deployment"):
        assert _admitted(_pod_labels(name), redis, 6379), f"{name} cannot reach Redis"
    assert _admitted(
        {"app.kubernetes.io/name": "ragline", "app.kubernetes.io/component": "ingest"}, redis, 6379
    )
    assert not _admitted(INTRUDER, redis, 6379)
    assert not _admitted({"app.kubernetes.io/name": "ragline"}, redis, 6379), (
        "a label alone is not a component"
    )
    assert not _admitted(_pod_labels("api"), redis, 6379, namespace="elsewhere")
    assert not _admitted(PROMETHEUS, redis, 6379, namespace="monitoring")
    assert not _admitted(_pod_labels("api"), redis, 6380)


@pytest.mark.parametrize("name", WORKERS + SHARD_GROUPS)
def test_worker_metrics_admit_ragline_pods_and_prometheus_only(name: str) -> None:
    worker = _pod_labels(name)
    assert _admitted(_pod_labels("api"), worker, WORKER_METRICS_PORT)
    assert _admitted(PROMETHEUS, worker, WORKER_METRICS_PORT, namespace="monitoring")
    assert not _admitted(PROMETHEUS, worker, WORKER_METRICS_PORT, namespace="elsewhere")
    assert not _admitted(INTRUDER, worker, WORKER_METRICS_PORT)
    assert not _admitted(_pod_labels("api"), worker, 8000), "workers serve nothing else"


def test_the_api_admits_everyone_on_its_port_only() -> None:
    api = _pod_labels("api")
    assert _admitted(INTRUDER, api, 8000, namespace="ingress-nginx")
    assert not _admitted(INTRUDER, api, 9100)


def test_flower_admits_this_namespace_only() -> None:
    flower = _pod_labels("flower")
    assert _admitted(_pod_labels("api"), flower, 5555)
    assert not _admitted(_pod_labels("api"), flower, 5555, namespace="elsewhere")


# -- KEDA -----------------------------------------------------------------------------------


def _exported_metric_names() -> set[str]:
    import ragline.broker.metrics  # noqa: F401  (registers every ragline metric)
    from prometheus_client import REGISTRY

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
            assert used <= exported, (
                f"{name}: not exported by ragline.broker.metrics: {sorted(used - exported)}"
            )
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


# -- shard groups (components/shards) -------------------------------------------------------


def test_shards_component_lists_every_manifest() -> None:
    component = _shards_component()
    assert component["apiVersion"] == "kustomize.config.k8s.io/v1alpha1"
    assert component["kind"] == "Component"
    listed = [*component["resources"], *(p["path"] for p in component["patches"])]
    assert sorted(listed) == sorted(
        p.name for p in SHARDS_DIR.glob("*.yaml") if p.name != "kustomization.yaml"
    )
    assert {f"{name}.yaml" for name in SHARD_GROUPS} == set(component["resources"])


def _shard_group_queues(name: str) -> list[str]:
    """The queues the group's command makes its workers consume."""
    command = _container(_objects("Deployment")[name])["command"]
    assert command[:4] == ["ragline", "worker", "retrieval", "--shards"] and len(command) == 5, command
    selection = shards.parse_selection(command[4])
    assert selection, f"{name}: a shard group names its shards (not `all` or `none`): {command[4]}"
    return shards.worker_queues([], selection)


@pytest.mark.parametrize("name", SHARD_GROUPS)
def test_shard_group_consumes_only_its_shard_queues(name: str) -> None:
    queues = _shard_group_queues(name)
    assert RETRIEVAL_QUEUE not in queues, "a shard worker takes no batches"
    for queue in queues:
        shard = queue.removeprefix(f"{RETRIEVAL_QUEUE}.")
        assert shards.split_shard(shard) and shards.shard_queue(shard) == queue, queue
    labels = _pod_labels(name)
    # The component label the NetworkPolicies admit for every group; the group label sets it apart.
    assert labels["app.kubernetes.io/component"] == "retrieval-shards"
    assert labels["ragline.io/shard-group"]


@pytest.mark.parametrize("name", SHARD_GROUPS)
def test_shard_group_scales_on_exactly_its_shard_queues(name: str) -> None:
    [so] = [s for s in SCALED_OBJECTS if s["spec"]["scaleTargetRef"]["name"] == name]
    triggered = []
    for trigger in so["spec"]["triggers"]:
        query = trigger["metadata"]["query"]
        queues = re.findall(r'queue="([^"]+)"', query)
        assert len(queues) == 1, f"{name}: one shard queue per trigger: {query}"
        assert query == f'max(ragline_shard_queue_waiting{{queue="{queues[0]}"}})', query
        assert trigger.get("metricType", "AverageValue") == "AverageValue"
        assert float(trigger["metadata"]["threshold"]) > 0
        triggered += queues
    assert sorted(triggered) == sorted(_shard_group_queues(name)), (
        f"{name}: the triggers must list exactly the queues its command consumes"
    )
    # A shard whose every pod is gone drops out of every answer.
    assert so["spec"]["minReplicaCount"] >= 1


@pytest.mark.parametrize("name", SHARD_GROUPS)
def test_shard_group_is_found_by_prometheus(name: str) -> None:
    text = (REPO / "deploy" / "prometheus" / "prometheus.yml").read_text(encoding="utf-8")
    assert f"{name}.ragline.svc.cluster.local" in text
    assert "retrieval-shards" in text.split("regex:", 1)[1].splitlines()[0]


def test_coordinators_take_batches_and_hold_no_shard() -> None:
    """With shard groups, the base retrieval workers keep taking batches and search every shard over
    its queue, loading none: the patch changes only their command."""
    [(_, patch)] = _load(SHARDS_DIR / "coordinator.yaml")
    assert (patch["kind"], patch["metadata"]["name"]) == ("Deployment", "retrieval-worker")
    [container] = patch["spec"]["template"]["spec"]["containers"]
    assert container["name"] == _container(_objects("Deployment")["retrieval-worker"])["name"]
    assert set(container) == {"name", "command"}
    command = container["command"]
    assert command[:4] == ["ragline", "worker", "retrieval", "--shards"] and len(command) == 5, command
    selection = shards.parse_selection(command[4])
    assert selection == frozenset()
    assert shards.worker_queues([], selection) == [RETRIEVAL_QUEUE]
