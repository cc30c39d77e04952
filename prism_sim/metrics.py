"""Prometheus metrics of the simulated engine under SGLang 0.5.23's names (SGLANG-NOTES).

Gauges (and the eviction counter) are read from the scheduler when scraped; token and
request counters and latency histograms are recorded when a request finishes. Every
latency is in **modeled** seconds. One `CollectorRegistry` per app (no global state),
label `model_name`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
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
        family = CounterMetricFamily(
            "sglang:evicted_tokens", "KV token slots freed by eviction.", labels=["model_name"]
        )
        family.add_metric(labels, float(sched.cache.evicted_tokens_total))
        yield family


def cached_tokens_details(req: SimRequest) -> dict[str, int]:
    """SGLang's `cached_tokens_details`: the cached prefix split by where it was found."""
    return {"device": req.cached_tokens - req.host_hit_tokens, "host": req.host_hit_tokens}


class EngineMetrics:
    """The engine's registry: scrape-time gauges plus per-request counters and
    histograms, recorded when a request finishes (aborts included), as SGLang 0.5.23's
    `observe_one_finished_request` does, with its label sets (`is_streaming`,
    `cache_source`)."""

    def __init__(self, scheduler: Scheduler, model_name: str, now: Callable[[], float]):
        self.model_name = model_name
        # With the host tier, cached tokens are counted by source (device, host) as
        # SGLang does when a request has `cached_tokens_details`; without, "total".
        self.by_cache_source = scheduler.host_tier is not None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_SchedulerCollector(scheduler, model_name, now))
        reg = self.registry
        by_stream = ["model_name", "is_streaming"]
        self.prompt_tokens = Counter(
            "sglang:prompt_tokens", "Number of prefill tokens processed.", by_stream, registry=reg
        )
        self.generation_tokens = Counter(
            "sglang:generation_tokens", "Number of generation tokens.", by_stream, registry=reg
        )
        self.cached_tokens = Counter(
            "sglang:cached_tokens",
            "Number of cached prompt tokens by source.",
            ["model_name", "cache_source"],
            registry=reg,
        )
        self.num_requests = Counter(
            "sglang:num_requests", "Number of requests processed.", by_stream, registry=reg
        )
        self.num_aborted = Counter(
            "sglang:num_aborted_requests", "Number of aborted requests.", ["model_name"],
            registry=reg,
        )  # fmt: skip
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds", "Time to first token (modeled s).", by_stream,
            registry=reg, buckets=LATENCY_BUCKETS_S,
        )  # fmt: skip
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds", "End-to-end latency (modeled s).", by_stream,
            registry=reg, buckets=LATENCY_BUCKETS_S,
        )  # fmt: skip
        self.tpot = Histogram(
            "sglang:request_time_per_output_token_seconds",
            "Per-request TPOT (modeled s).", by_stream, registry=reg, buckets=ITL_BUCKETS_S,
        )  # fmt: skip
        self.queue_time = Histogram(
            "sglang:queue_time_seconds", "Time waiting before admission (modeled s).",
            ["model_name"], registry=reg, buckets=LATENCY_BUCKETS_S,
        )  # fmt: skip
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds", "Inter-token latency (modeled s).",
            ["model_name"], registry=reg, buckets=ITL_BUCKETS_S,
        )  # fmt: skip
        for counter in (self.prompt_tokens, self.generation_tokens, self.num_requests):
            for streaming in ("true", "false"):
                counter.labels(model_name, streaming)  # exported as 0 from the start
        self.cached_tokens.labels(model_name, "total")
        self.num_aborted.labels(model_name)

    def observe_finished(self, req: SimRequest) -> None:
        """Record a finished request. As SGLang 0.5.23: a request aborted while waiting
        only counts as aborted; one aborted after admission also adds its tokens and
        latencies. Deviation: `num_requests_total` counts normal finishes only (SGLang
        also counts requests aborted while running)."""
        if req.finish_s is None:
            return
        name, streaming = self.model_name, "true" if req.stream else "false"
        aborted = req.finish_reason is not None and req.finish_reason.get("type") == "abort"
        if aborted:
            self.num_aborted.labels(name).inc()
        if req.admitted_s is None:
            return
        self.prompt_tokens.labels(name, streaming).inc(len(req.input_ids))
        self.generation_tokens.labels(name, streaming).inc(len(req.output_ids))
        if req.cached_tokens > 0 and self.by_cache_source:
            for source, value in cached_tokens_details(req).items():
                if value > 0:
                    self.cached_tokens.labels(name, source).inc(value)
        elif req.cached_tokens > 0:
            self.cached_tokens.labels(name, "total").inc(req.cached_tokens)
        if not aborted:
            self.num_requests.labels(name, streaming).inc()
        self.e2e.labels(name, streaming).observe(req.finish_s - req.arrival_s)
        self.queue_time.labels(name).observe(req.admitted_s - req.arrival_s)
        if req.first_token_s is not None:
            self.ttft.labels(name, streaming).observe(req.first_token_s - req.arrival_s)
            if len(req.output_ids) > 1:
                # The engine keeps no per-token times: each interval counts as the mean.
                tpot = (req.finish_s - req.first_token_s) / (len(req.output_ids) - 1)
                self.tpot.labels(name, streaming).observe(tpot)
                itl = self.itl.labels(name)
                for _ in range(len(req.output_ids) - 1):
                    itl.observe(tpot)
