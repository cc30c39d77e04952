"""The Grafana dashboard and its provisioning are consistent. That every metric
the dashboard queries is exported is checked against live processes in
tests/test_deploy_stack.py."""

from __future__ import annotations

import json

import pytest
import yaml
from deploy_support import REPO, load_script

GRAFANA = REPO / "deploy" / "grafana"


builder = load_script(GRAFANA / "build_dashboard.py")


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("prism:queue_depth", {"prism:queue_depth"}),
        # Functions, grouping labels, ranges and Grafana variables are not metrics.
        (
            "histogram_quantile(0.99, sum by (le, lane) (rate(prism:ttft_seconds_bucket"
            "[$__rate_interval])))",
            {"prism:ttft_seconds_bucket"},
        ),
        # Label matchers may hold anything, including parentheses and metric-like words.
        ('sum(rate(a_total{job="x", path=~"/m(etrics)?", b="c:d"}[5m]))', {"a_total"}),
        # Binary operators, vector matching, bool modifiers and numbers.
        (
            "sum by (lane) (rate(x[1m])) / on (lane) group_left (le) y > bool 1e6 and z"
            " offset 5m unless w",
            {"x", "y", "z", "w"},
        ),
        (
            "sum(increase(p:c_total[$__range])) / sum(increase(p:q_total[$__range]))",
            {"p:c_total", "p:q_total"},
        ),
    ],
)
def test_metric_names_of_a_promql_expression(expr: str, names: set[str]) -> None:
    assert builder.metric_names(expr) == names


def test_committed_dashboard_is_the_generated_one() -> None:
    assert builder.main(["--check"]) == 0
    committed = json.loads((GRAFANA / "dashboards" / "prism.json").read_text())
    assert committed == builder.build_dashboard()


def test_dashboard_covers_the_views_issue_7_asks_for() -> None:
    dashboard = builder.build_dashboard()
    exprs = builder.expressions(dashboard)
    names = set().union(*(builder.metric_names(e) for e in exprs))
    # P50/P99 TTFT and admission wait from the proxy's histograms.
    for family in ("prism:ttft_seconds", "prism:admission_wait_seconds"):
        for q in ("0.5", "0.99"):
            assert f"histogram_quantile({q}, sum by (le) (rate({family}_bucket" in "\n".join(exprs)
    # Hit rate, proxy side and SGLang side.
    assert {"prism:cached_tokens_total", "prism:prompt_tokens_total"} <= names
    assert {"sglang:cached_tokens_total", "sglang:prompt_tokens_total"} <= names
    # Queue depth, in-flight, waves and the lane mix.
    assert {"prism:queue_depth", "prism:inflight_requests", "prism:wave_size_count"} <= names
    assert any("by (lane) (rate(prism:requests_total" in e for e in exprs)
    # Control RPC health and DART evictions by class.
    assert {"prism:control_rpc_up", "prism:control_rpc_failures_total"} <= names
    assert any("by (class) (rate(prism:dart_evicted_tokens_total" in e for e in exprs)


def test_panels_use_the_provisioned_datasource_and_fit_the_grid() -> None:
    provisioned = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    (datasource,) = provisioned["datasources"]
    assert datasource["url"] == "http://prometheus:9090"  # the compose service
    dashboard = builder.build_dashboard()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == datasource["uid"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == datasource["uid"]


def test_dashboard_provider_points_at_the_mounted_dashboards() -> None:
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "prism.yml").read_text())
    (entry,) = provider["providers"]
    mount_target = entry["options"]["path"]
    for compose_file in ("docker-compose.yml", "docker-compose.sim.yml"):
        grafana = yaml.safe_load((REPO / compose_file).read_text())["services"]["grafana"]
        assert f"./deploy/grafana/dashboards:{mount_target}:ro" in grafana["volumes"]
        assert "./deploy/grafana/provisioning:/etc/grafana/provisioning:ro" in grafana["volumes"]


def test_metrics_reference_documents_every_dashboard_metric() -> None:
    doc = (REPO / "docs" / "deploy.md").read_text()
    families = set()
    for expr in builder.expressions(builder.build_dashboard()):
        for name in builder.metric_names(expr):
            for suffix in ("_bucket", "_sum", "_count"):
                name = name.removesuffix(suffix)
            families.add(name)
    missing = sorted(f for f in families if f"`{f}" not in doc)
    assert not missing, f"docs/deploy.md does not describe {missing}"
