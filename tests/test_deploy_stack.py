"""The CPU stack end to end on loopback: prism-sim (DART, control RPC with a
token), the proxy in front, and a real Prometheus server (Debian's binary) scraping all
three every second, fed by a short zipf_hotspot replay through the proxy.

* every metric the Grafana dashboard queries is exported by the proxy, the simulated
  engine or the control RPC (scraped directly, histograms as `_bucket/_sum/_count`);
* Prometheus's HTTP API gives the hit rate and the P99 TTFT, and its proxy-side hit
  rate equals what the client summed from the `usage` of its own answers;
* every dashboard query is valid PromQL for the real server.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from deploy_support import REPO, load_script
from prometheus_client.parser import text_string_to_metric_families

cpu_stack = load_script(REPO / "scripts" / "cpu_stack.py")
builder = load_script(REPO / "deploy" / "grafana" / "build_dashboard.py")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        cpu_stack.find_prometheus() is None,
        reason="prometheus (Debian package prometheus) is not installed; `make tools`",
    ),
]

SPEED = 4.0


class Run:
    """One stack with one replay, shared by the tests of this module."""

    def __init__(self, stack: Any, results: dict[str, Any], measured: dict[str, Any]) -> None:
        self.stack = stack
        self.results = results
        self.measured = measured


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    workdir = tmp_path_factory.mktemp("cpu-stack")
    # A small KV capacity (≈ 8 prompts of the trace) so that the engine evicts.
    with cpu_stack.cpu_stack(workdir, speed=SPEED, kv_capacity_tokens=6000) as stack:
        results = cpu_stack.replay_trace(stack.proxy_url, requests=30, qps=40.0, speed=SPEED)
        measured = cpu_stack.measure(stack, results)
        yield Run(stack, results, measured)


def sample_names(text: str) -> set[str]:
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def test_every_dashboard_metric_is_exported(run: Run) -> None:
    stack = run.stack
    exported = sample_names(httpx.get(stack.proxy_url + "/metrics").text)
    exported |= sample_names(httpx.get(stack.engine_url + "/metrics").text)
    auth = {"Authorization": f"Bearer {stack.control_token}"}
    control = httpx.get(stack.control_url + "/prism/metrics", headers=auth)
    assert control.status_code == 200
    exported |= sample_names(control.text)

    queried = set()
    for expr in builder.expressions(builder.build_dashboard()):
        queried |= builder.metric_names(expr)
    assert len(queried) >= 20  # the parser found the dashboard's metrics
    missing = sorted(queried - exported)
    assert not missing, f"queried by the dashboard but exported by nobody: {missing}"


def test_control_rpc_metrics_need_the_token(run: Run) -> None:
    response = httpx.get(run.stack.control_url + "/prism/metrics")
    assert response.status_code == 401


def test_prometheus_reports_hit_rate_and_p99_ttft(run: Run) -> None:
    m = run.measured
    assert m["completed"] == m["requests"] == 30
    hit_rate = m["prometheus_hit_rate_proxy"]
    assert hit_rate is not None and 0.0 < hit_rate <= 1.0
    # The proxy counts the engine's cached tokens, and its one client is told all of
    # them: its own reuse (`prompts.sharing`) is what its answers carried in `usage`.
    assert math.isclose(hit_rate, m["client_hit_rate"], rel_tol=1e-9)
    engine_hit_rate = m["prometheus_hit_rate_engine"]
    assert engine_hit_rate is not None and 0.0 < engine_hit_rate <= 1.0
    p99 = m["prometheus_p99_ttft_s"]
    assert p99 is not None and math.isfinite(p99) and p99 > 0.0
    # The DART panel has data: the engine evicted under its small KV capacity.
    assert m["prometheus_dart_evicted_tokens"] > 0
    assert m["prometheus_engine_evicted_tokens"] > 0


def test_dashboard_queries_are_valid_promql(run: Run) -> None:
    prometheus_url = run.stack.prometheus_url
    answered = 0
    for expr in builder.expressions(builder.build_dashboard()):
        concrete = expr.replace("$__rate_interval", "15s").replace("$__range", "5m")
        data = cpu_stack.query(prometheus_url, concrete)  # raises on a parse error
        answered += bool(data["result"])
    assert answered > 0


def test_prometheus_rejects_invalid_promql(run: Run) -> None:
    """The check above can fail: the server refuses a malformed expression."""
    with pytest.raises(ValueError, match="failed"):
        cpu_stack.query(run.stack.prometheus_url, "sum(rate(prism:requests_total[5m])")
