"""Every `sglang:*` metric the Grafana dashboard queries is one that SGLang 0.5.23 itself
declares in its scheduler, tokenizer and radix-cache metrics collectors, built on CPU
through their dependency-injection hooks. The simulated engine's names are checked against
the dashboard over real HTTP in tests/test_deploy_stack.py."""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import pytest

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parents[2]


def load_builder() -> ModuleType:
    path = REPO / "deploy" / "grafana" / "build_dashboard.py"
    spec = importlib.util.spec_from_file_location("build_dashboard", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_dashboard"] = module
    spec.loader.exec_module(module)
    return module


def dashboard_sglang_metrics() -> set[str]:
    """The `sglang:*` sample names the Grafana dashboard's queries use."""
    builder = load_builder()
    queried: set[str] = set()
    for expr in builder.expressions(builder.build_dashboard()):
        queried |= {n for n in builder.metric_names(expr) if n.startswith("sglang:")}
    return queried


class _Recorder:
    """Stands in for a prometheus_client metric class; records the exported sample names
    the real class would produce (counters gain `_total`, histograms three series)."""

    declared: ClassVar[set[str]] = set()
    suffixes: ClassVar[tuple[str, ...]] = ("",)

    def __init__(self, name: str, *args: Any, **kwargs: Any) -> None:
        base = name.removesuffix("_total") if self.suffixes == ("_total",) else name
        _Recorder.declared.update(base + suffix for suffix in self.suffixes)

    def labels(self, *args: Any, **kwargs: Any) -> _Recorder:
        return self

    def __getattr__(self, name: str) -> Any:  # set / inc / observe / ...
        return lambda *args, **kwargs: None


class _Counter(_Recorder):
    suffixes = ("_total",)


class _Histogram(_Recorder):
    suffixes = ("_bucket", "_sum", "_count")


def sglang_declared_samples(server_args: Any) -> set[str]:
    from sglang.srt.observability import metrics_collector as mc

    injected = {
        "_counter_cls": _Counter,
        "_gauge_cls": _Recorder,
        "_histogram_cls": _Histogram,
        "_summary_cls": _Histogram,
    }
    labels = {"model_name": "m", "engine_type": "unified", "tp_rank": 0, "pp_rank": 0}
    labels["moe_ep_rank"] = 0
    _Recorder.declared = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scheduler_cls = type("Scheduler", (mc.SchedulerMetricsCollector,), injected)
        scheduler_cls(labels=labels, server_args=server_args)
        tokenizer_cls = type("Tokenizer", (mc.TokenizerMetricsCollector,), injected)
        tokenizer_cls(server_args=server_args, labels={"model_name": "m"})
        # The radix cache's own collector (evictions); DART's cache inherits its evict path.
        radix_cls = type("Radix", (mc.RadixCacheMetricsCollector,), injected)
        radix_cls(labels={"model_name": "m"})
    return set(_Recorder.declared)


def test_dashboard_sglang_metrics_are_declared_by_sglang(published_server_args: Any) -> None:
    declared = sglang_declared_samples(published_server_args)
    assert "sglang:num_running_reqs" in declared  # the recorder saw SGLang's metrics
    queried = dashboard_sglang_metrics()
    assert len(queried) >= 6
    missing = sorted(queried - declared)
    assert not missing, f"the dashboard queries what SGLang 0.5.23 does not export: {missing}"


def test_dashboard_sglang_metrics_are_exported_by_a_live_server(live: dict[str, Any]) -> None:
    """The same names scraped from a real SGLang 0.5.23 (`--enable-metrics`) on this CPU
    after it served and evicted: the tight differential server (tests/sglang/live_support.py)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    server = live["stock"]
    server.fresh()
    ids = list(range(100, 1100))
    server.generate(ids)
    server.generate(ids)  # a cache hit: labelled counters appear with their first sample
    server.generate(list(range(2000, 2000 + server.max_total_tokens - 8)))  # evicts
    text = httpx.get(server.url + "/metrics", timeout=10.0).text
    exported = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    queried = dashboard_sglang_metrics()
    assert len(queried) >= 6
    assert not queried - exported, f"not exported: {sorted(queried - exported)}"
