"""The Sentinel variant of the Kubernetes manifests (deploy/k8s/components/sentinel), offline:
its objects validate, three pods on three nodes with a quorum kept through a drain, reachable
only from ragline's pods and each other, every password from the Secret; and its patches turn
every Deployment's RAGLINE_REDIS_URL into a Sentinel URL that ragline reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from ragline.broker.redis.target import parse

from tests.deploy.test_k8s import (
    K8S_DIR,
    K8S_VERSION,
    SECRET,
    SHARD_GROUPS,
    _objects,
    _pod_labels,
    _selects,
)

COMPONENT = K8S_DIR / "components" / "sentinel"
RAGLINE_POD = {"app.kubernetes.io/name": "ragline", "app.kubernetes.io/component": "api"}


def _docs(name: str) -> list[dict[str, Any]]:
    with (COMPONENT / name).open(encoding="utf-8") as fh:
        return [d for d in yaml.safe_load_all(fh) if d]


def _kustomization() -> dict[str, Any]:
    return _docs("kustomization.yaml")[0]


RESOURCES = [d for name in _kustomization()["resources"] for d in _docs(name)]


def _one(kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in RESOURCES if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def test_the_component_lists_files_that_exist() -> None:
    k = _kustomization()
    assert k["kind"] == "Component"
    for path in [*k["resources"], *(p["path"] for p in k["patches"])]:
        assert (COMPONENT / path).is_file(), path
    # Not on by default: the base keeps its single Redis.
    assert "components/sentinel" not in (K8S_DIR / "kustomization.yaml").read_text().split("# components:")[0]


@pytest.mark.parametrize("doc", RESOURCES, ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_its_objects_validate(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert not doc["metadata"].get("namespace")


def test_three_pods_on_three_nodes_and_a_drain_keeps_a_quorum() -> None:
    sts = _one("StatefulSet", "redis-ha")
    spec, pod = sts["spec"], sts["spec"]["template"]
    assert spec["replicas"] == 3 and spec["serviceName"] == "redis-ha"
    (rule,) = pod["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert rule["topologyKey"] == "kubernetes.io/hostname"
    assert _selects(rule["labelSelector"], pod["metadata"]["labels"])
    pdb = _one("PodDisruptionBudget", "redis-ha")
    assert pdb["spec"]["minAvailable"] == 2 and _selects(pdb["spec"]["selector"], pod["metadata"]["labels"])
    assert {c["name"] for c in pod["spec"]["containers"]} == {"redis", "sentinel"}
    service = _one("Service", "redis-ha")
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"]


def test_every_password_comes_from_the_secret_and_the_data_persists() -> None:
    pod = _one("StatefulSet", "redis-ha")["spec"]["template"]["spec"]
    for container in pod["containers"]:
        env = {e["name"]: e for e in container["env"]}
        for name in ("RAGLINE_REDIS_PASSWORD", "REDISCLI_AUTH"):
            assert env[name]["valueFrom"]["secretKeyRef"]["name"] == SECRET
    scripts = _one("ConfigMap", "redis-ha-scripts")["data"]
    redis_sh, sentinel_sh = scripts["redis.sh"], scripts["sentinel.sh"]
    for needed in ("--appendonly yes", "--maxmemory-policy noeviction", "--user default off", "--masterauth"):
        assert needed in redis_sh
    assert "requirepass $RAGLINE_REDIS_PASSWORD" in sentinel_sh
    assert "sentinel monitor ragline $primary 6379 2" in sentinel_sh  # a quorum of two of three
    assert "sentinel auth-pass ragline $RAGLINE_REDIS_PASSWORD" in sentinel_sh
    assert "sentinel resolve-hostnames yes" in sentinel_sh


def _admits(labels: dict[str, str], port: int) -> bool:
    dest = _one("StatefulSet", "redis-ha")["spec"]["template"]["metadata"]["labels"]
    policies = [p for p in [*_objects("NetworkPolicy").values(), _one("NetworkPolicy", "redis-ha")]]
    for policy in policies:
        spec = policy["spec"]
        if "Ingress" not in spec["policyTypes"] or not _selects(spec["podSelector"], dest):
            continue
        for rule in spec.get("ingress", []):
            if any(p.get("port") == port for p in rule.get("ports", [])) and any(
                "namespaceSelector" not in peer and _selects(peer.get("podSelector", {}), labels)
                for peer in rule.get("from", [])
            ):
                return True
    return False


def test_the_set_admits_ragline_pods_and_itself_only() -> None:
    node = _one("StatefulSet", "redis-ha")["spec"]["template"]["metadata"]["labels"]
    for name in _objects("Deployment"):
        assert _admits(_pod_labels(name), 26379) and _admits(_pod_labels(name), 6379), name
    assert _admits(node, 6379) and _admits(node, 26379)  # replication and the sentinels' own talk
    assert not _admits({"app": "intruder"}, 26379) and not _admits({"app": "intruder"}, 6379)
    assert not _admits({"app.kubernetes.io/name": "ragline"}, 26379)


def test_every_deployment_reaches_the_primary_through_the_sentinels() -> None:
    patches = _docs("redis-url.yaml")
    patched = {p["metadata"]["name"]: p for p in patches}
    # The base's Deployments (the shard groups' component says to set its URL by hand).
    base = {n: d for n, d in _objects("Deployment").items() if n not in SHARD_GROUPS}
    assert set(patched) == set(base)
    for name, deployment in base.items():
        containers = {c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]}
        (container,) = patched[name]["spec"]["template"]["spec"]["containers"]
        assert container["name"] in containers
        (env,) = container["env"]
        assert env["name"] == "RAGLINE_REDIS_URL"
        target = parse(env["value"].replace("$(RAGLINE_REDIS_PASSWORD)", "0123abcd"))
        assert target.is_sentinel and target.master == "ragline" and target.db == 0
        assert target.sentinels == tuple((f"redis-ha-{i}.redis-ha", 26379) for i in range(3))
        assert (target.username, target.password, target.sentinel_password) == (
            "ragline",
            "0123abcd",
            "0123abcd",
        )
    dropped = {(d["kind"], d["metadata"]["name"]) for d in _docs("drop-single-redis.yaml")}
    assert dropped == {("StatefulSet", "redis"), ("Service", "redis"), ("Service", "redis-headless")}
    assert all(d["$patch"] == "delete" for d in _docs("drop-single-redis.yaml"))


def test_the_scripts_are_shell_that_parses(tmp_path: Path) -> None:
    import subprocess

    for name, text in _one("ConfigMap", "redis-ha-scripts")["data"].items():
        (tmp_path / name).write_text(text)
        subprocess.run(["sh", "-n", str(tmp_path / name)], check=True)
