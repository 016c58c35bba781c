"""Offline checks of the monitoring config: Prometheus scrape config and alert rules, the Grafana
dashboard, and the KEDA queries.

`promtool` (Debian/Ubuntu package `prometheus`) checks the config, the rules and their unit tests,
and parses every dashboard and KEDA query. CI installs it; a missing binary is a failure, not a skip.
Every `ragline_*` name anywhere in them must be one that ragline.broker.metrics exports.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PROM_DIR = REPO / "deploy" / "prometheus"
PROMETHEUS_YML = PROM_DIR / "prometheus.yml"
ALERTS_YML = PROM_DIR / "alerts.yml"
ALERTS_TEST_YML = PROM_DIR / "alerts_test.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "ragline.json"
KEDA_YAML = REPO / "deploy" / "k8s" / "keda.yaml"
OPERATIONS_MD = REPO / "docs" / "operations.md"

METRIC_RE = re.compile(r"\bragline_[a-zA-Z0-9_]+")
SELECTOR_RE = re.compile(r"\b(ragline_[a-zA-Z0-9_]+)\{([^}]*)\}")
LABEL_MATCHER_RE = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
# Labels Prometheus or the scrape config attach to every series.
TARGET_LABELS = {"job", "instance", "namespace", "component", "pod"}


# -- what the code exports -------------------------------------------------------------------


def _exported() -> tuple[set[str], dict[str, set[str]], dict[str, str]]:
    """Exported sample names, the label names of each, and each one's family name."""
    import ragline.broker.metrics as metrics
    from prometheus_client import REGISTRY
    from prometheus_client.metrics import MetricWrapperBase

    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}
    names: set[str] = set()
    families: dict[str, str] = {}
    for family in REGISTRY.collect():
        if not family.name.startswith("ragline_"):
            continue
        # Labelled metrics with no child yet list no samples: derive the names from the type.
        for suffix in suffixes.get(family.type, ("",)):
            names.add(family.name + suffix)
            families[family.name + suffix] = family.name
        names.update(sample.name for sample in family.samples)

    labels: dict[str, set[str]] = {}
    for obj in vars(metrics).values():
        if isinstance(obj, MetricWrapperBase):
            family = obj._name  # the name without a counter's _total, as REGISTRY reports it
            for sample_name, fam in families.items():
                if fam == family:
                    extra = {"le"} if sample_name.endswith("_bucket") else set()
                    labels[sample_name] = set(obj._labelnames) | extra
    return names, labels, families


EXPORTED, EXPORTED_LABELS, FAMILY_OF = _exported()


def test_exported_names_are_what_the_scrape_shows() -> None:
    # Counter("ragline_requests_total") exports ragline_requests_total, not ..._total_total.
    assert "ragline_requests_total" in EXPORTED
    assert "ragline_requests_total_total" not in EXPORTED
    assert {
        "ragline_request_seconds_bucket",
        "ragline_request_seconds_count",
        "ragline_queue_depth",
    } <= EXPORTED
    assert "ragline_request_seconds" not in EXPORTED, "a histogram has no bare series"
    assert EXPORTED_LABELS["ragline_request_seconds_bucket"] == {"endpoint", "mode", "le"}


# -- where names are used --------------------------------------------------------------------


def _dashboard() -> dict[str, Any]:
    with DASHBOARD.open(encoding="utf-8") as fh:
        return json.load(fh)


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows keep theirs inside
    return out


def _dashboard_exprs() -> list[str]:
    return [t["expr"] for p in _panels(_dashboard()) for t in p.get("targets", []) if t.get("expr")]


def _rules() -> list[dict[str, Any]]:
    with ALERTS_YML.open(encoding="utf-8") as fh:
        return [rule for group in yaml.safe_load(fh)["groups"] for rule in group["rules"]]


def _keda_queries() -> list[str]:
    with KEDA_YAML.open(encoding="utf-8") as fh:
        docs = [d for d in yaml.safe_load_all(fh) if d]
    return [t["metadata"]["query"] for d in docs for t in d["spec"]["triggers"] if t["type"] == "prometheus"]


SOURCES = {
    "dashboard": DASHBOARD,
    "alerts": ALERTS_YML,
    "alert unit tests": ALERTS_TEST_YML,
    "keda": KEDA_YAML,
    "prometheus": PROMETHEUS_YML,
}


@pytest.mark.parametrize("source", list(SOURCES))
def test_every_metric_name_is_exported(source: str) -> None:
    text = SOURCES[source].read_text(encoding="utf-8")
    used = set(METRIC_RE.findall(text))
    unknown = used - EXPORTED
    hints = {
        name: "histograms are queried as _bucket/_sum/_count"
        for name in unknown
        if f"{name}_bucket" in EXPORTED
    }
    assert not unknown, (
        f"{source} uses names ragline.broker.metrics does not export: {sorted(unknown)} {hints}"
    )


@pytest.mark.parametrize("source", list(SOURCES))
def test_selector_labels_exist_on_the_metric(source: str) -> None:
    text = SOURCES[source].read_text(encoding="utf-8")
    wrong = []
    for name, body in SELECTOR_RE.findall(text):
        if name not in EXPORTED_LABELS:
            continue  # reported by test_every_metric_name_is_exported
        allowed = EXPORTED_LABELS[name] | TARGET_LABELS
        wrong += [f"{name}{{{label}}}" for label in LABEL_MATCHER_RE.findall(body) if label not in allowed]
    assert not wrong, f"{source} selects on labels the metric does not have: {wrong}"


def test_dashboard_shows_every_exported_metric() -> None:
    used = set(METRIC_RE.findall(" ".join(_dashboard_exprs())))
    shown = {FAMILY_OF[name] for name in used if name in FAMILY_OF}
    missing = sorted(set(FAMILY_OF.values()) - shown)
    assert not missing, f"exported by ragline.broker.metrics but on no dashboard panel: {missing}"


# -- promtool ---------------------------------------------------------------------------------


def _promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail(
            "promtool is not on PATH; it is needed to check the Prometheus config and alert rules "
            "(Debian/Ubuntu: `apt-get install -y prometheus`)",
            pytrace=False,
        )
    return exe


def _run_promtool(*args: str) -> None:
    cmd = [_promtool(), *args]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"


def test_promtool_check_rules() -> None:
    _run_promtool("check", "rules", str(ALERTS_YML.relative_to(REPO)))


def test_promtool_check_config() -> None:
    _run_promtool("check", "config", str(PROMETHEUS_YML.relative_to(REPO)))


def test_promtool_alert_unit_tests() -> None:
    _run_promtool("test", "rules", str(ALERTS_TEST_YML.relative_to(REPO)))


def test_dashboard_and_keda_queries_parse(tmp_path: Path) -> None:
    # promtool has no "parse this expression"; a recording rule per query gets the same check.
    exprs = _dashboard_exprs() + _keda_queries()
    grafana_vars = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
    rules = []
    for i, expr in enumerate(exprs):
        for var, value in grafana_vars.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, f"unknown Grafana variable in {expr}"
        rules.append({"record": f"check:query_{i}", "expr": expr})
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "queries", "rules": rules}]}), encoding="utf-8")
    _run_promtool("check", "rules", str(path))


# -- Prometheus config ----------------------------------------------------------------------


def test_prometheus_scrapes_api_and_workers_and_loads_alerts() -> None:
    with PROMETHEUS_YML.open(encoding="utf-8") as fh:
        config = yaml.safe_load(fh)
    assert "alerts.yml" in config["rule_files"]
    ports = set()
    for job in config["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            ports.add(sd["port"])
        for sc in job.get("static_configs", []):
            ports.update(int(t.rsplit(":", 1)[1]) for t in sc["targets"])
        if job.get("kubernetes_sd_configs"):
            ports.add("annotations")
    assert {8000, 9100} <= ports or "annotations" in ports, (
        f"API (8000) and workers (9100) not scraped: {ports}"
    )


# -- alert rules ----------------------------------------------------------------------------


def _alert(name: str) -> dict[str, Any]:
    found = [r for r in _rules() if r.get("alert") == name]
    assert len(found) == 1, f"alert {name} missing"
    return found[0]


def test_required_alerts() -> None:
    exprs = {r["alert"]: re.sub(r"\s+", " ", r["expr"]) for r in _rules() if "alert" in r}
    assert any(
        "ragline_request_seconds_bucket" in e and "histogram_quantile(0.99" in e for e in exprs.values()
    )
    assert any("deriv(ragline_queue_depth" in e and "ragline_queue_depth) >" in e for e in exprs.values())
    assert "max by (queue) (ragline_live_workers) == 0" in exprs["RaglineNoLiveWorker"]
    assert "absent(ragline_live_workers" in exprs["RaglineLiveWorkersUnknown"]
    assert "increase(ragline_webhook_dead_letters_total[10m])) > 0" in exprs["RaglineWebhookDeadLetters"]
    assert "ragline_rejections_total" in exprs["RaglineHighRejectionRate"]


def test_alerts_are_labelled_and_have_a_runbook_section() -> None:
    docs = OPERATIONS_MD.read_text(encoding="utf-8")
    # GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes.
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", docs, flags=re.M)
    }
    for rule in _rules():
        if "alert" not in rule:
            continue
        name = rule["alert"]
        assert rule["labels"]["severity"] in {"page", "warning"}, name
        assert rule["annotations"]["summary"], name
        runbook = rule["annotations"]["runbook"]
        path, _, anchor = runbook.partition("#")
        assert path == "docs/operations.md", name
        assert anchor in anchors, f"{name}: docs/operations.md has no heading for #{anchor}"


# -- Grafana dashboard ----------------------------------------------------------------------


def test_dashboard_shape_and_datasource() -> None:
    dashboard = _dashboard()
    assert dashboard["uid"] and dashboard["title"]
    assert 36 <= dashboard["schemaVersion"] <= 41
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    panels = _panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_dashboard_has_the_required_views() -> None:
    exprs = [re.sub(r"\s+", " ", e) for e in _dashboard_exprs()]
    joined = " ".join(exprs)

    def has(*fragments: str) -> bool:
        return any(all(f in e for f in fragments) for e in exprs)

    assert has("rate(ragline_requests_total")
    for metric in (
        "ragline_request_seconds",
        "ragline_queue_wait_seconds",
        "ragline_embed_seconds",
        "ragline_search_seconds",
        "ragline_ttft_seconds",
        "ragline_generation_seconds",
    ):
        assert has("histogram_quantile(0.5,", f"{metric}_bucket"), f"no P50 of {metric}"
        assert has("histogram_quantile(0.99,", f"{metric}_bucket"), f"no P99 of {metric}"
    assert has("ragline_queue_depth")
    assert has("max by (queue) (ragline_queue_predicted_wait_seconds)"), "no predicted wait per queue"
    assert has("rate(ragline_stream_stalls_total")
    assert has("sum by (reason)", "ragline_rejections_total")
    assert has("ragline_cache_hits_total", "ragline_cache_misses_total", "by (level)"), (
        "no hit rate per level"
    )
    assert has("rate(ragline_generated_tokens_total")
    for metric in (
        "ragline_engine_running_seqs",
        "ragline_engine_waiting_seqs",
        "ragline_engine_kv_cache_usage",
    ):
        assert metric in joined
    assert has("ragline_degraded_total")
    assert has("ragline_coalesced_batch_size")
