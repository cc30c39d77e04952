"""Prometheus metrics of the simulated engine under SGLang 0.5.23's names (SGLANG-NOTES).

Counters and gauges are read from the scheduler when scraped; latency histograms are
observed when a request finishes. Every latency is in **modeled** seconds. One
`CollectorRegistry` per app (no global state), label `model_name`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from prism_sim.request import SimRequest
from prism_sim.scheduler import Scheduler

LATENCY_BUCKETS_S = (
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    15.0, 20.0, 30.0, 40.0, 60.0, 90.0, 120.0, 180.0, 300.0,
)  # fmt: skip
ITL_BUCKETS_S = (
    0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08,
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0,
)  # fmt: skip


class _SchedulerCollector(Collector):
    """Scrape-time view of the scheduler's counters and gauges."""

    def __init__(self, scheduler: Scheduler, model_name: str, now: Callable[[], float]):
        self.scheduler = scheduler
        self.model_name = model_name
        self.now = now
        self._last_scrape = (now(), 0)
        self._gen_throughput = 0.0

    def collect(self) -> Iterator[Metric]:
        sched, labels = self.scheduler, [self.model_name]
        stats = sched.stats
        now = self.now()
        last_t, last_tokens = self._last_scrape
        if now > last_t:
            self._gen_throughput = (stats.generation_tokens_total - last_tokens) / (now - last_t)
            self._last_scrape = (now, stats.generation_tokens_total)
        cap = sched.config.kv_capacity_tokens
        gauges = {
            "sglang:num_running_reqs": ("Running requests.", sched.num_running),
            "sglang:num_queue_reqs": ("Waiting requests.", len(sched.waiting)),
            "sglang:num_used_tokens": ("KV tokens in use.", sched.used_tokens),
            "sglang:token_usage": ("KV token usage fraction.", sched.used_tokens / cap),
            "sglang:cache_hit_rate": (
                "Prefix-cache hit rate of the last prefill batch.",
                stats.last_prefill_hit_rate,
            ),
            "sglang:gen_throughput": (
                "Generation throughput (tokens/s, modeled) since the previous scrape.",
                self._gen_throughput,
            ),
            "sglang:max_total_num_tokens": ("KV capacity in tokens.", cap),
        }
        for name, (doc, value) in gauges.items():
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric(labels, float(value))
            yield family
        counters = {
            "sglang:prompt_tokens": ("Prompt tokens admitted.", stats.prompt_tokens_total),
            "sglang:generation_tokens": ("Generated tokens.", stats.generation_tokens_total),
            "sglang:cached_tokens": ("Prompt tokens from the cache.", stats.cached_tokens_total),
            "sglang:num_requests": ("Finished requests.", stats.num_requests_total),
            "sglang:num_aborted_requests": ("Aborted requests.", stats.num_aborted_total),
            "sglang:evicted_tokens": ("Evicted tokens.", sched.cache.evicted_tokens_total),
        }
        for name, (doc, value) in counters.items():
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            family.add_metric(labels, float(value))
            yield family


class EngineMetrics:
    """The engine's registry plus the per-request histograms."""

    def __init__(self, scheduler: Scheduler, model_name: str, now: Callable[[], float]):
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_SchedulerCollector(scheduler, model_name, now))

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(
                name, doc, ["model_name"], registry=self.registry, buckets=buckets
            ).labels(model_name)

        self.ttft = histogram(
            "sglang:time_to_first_token_seconds", "Time to first token.", LATENCY_BUCKETS_S
        )
        self.e2e = histogram(
            "sglang:e2e_request_latency_seconds", "End-to-end request latency.", LATENCY_BUCKETS_S
        )
        self.queue_time = histogram(
            "sglang:queue_time_seconds", "Time spent waiting before admission.", LATENCY_BUCKETS_S
        )
        self.itl = histogram(
            "sglang:inter_token_latency_seconds", "Mean inter-token latency.", ITL_BUCKETS_S
        )

    def observe_finished(self, req: SimRequest) -> None:
        """Record a finished request's latencies (aborted ones are skipped)."""
        if req.finish_reason is None or req.finish_reason.get("type") == "abort":
            return
        if req.finish_s is None:
            return
        self.e2e.observe(req.finish_s - req.arrival_s)
        if req.admitted_s is not None:
            self.queue_time.observe(req.admitted_s - req.arrival_s)
        if req.first_token_s is not None:
            self.ttft.observe(req.first_token_s - req.arrival_s)
            if len(req.output_ids) > 1:
                itl = (req.finish_s - req.first_token_s) / (len(req.output_ids) - 1)
                self.itl.observe(itl)
