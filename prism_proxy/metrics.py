"""The proxy's Prometheus metrics, one registry per app (docs/proxy.md, "Metrics").

Lanes: `hot`, `cold` (the QAS lane that released the request, SPEC §2) and
`passthrough` (sent unchanged to the backend's OpenAI endpoint). Requests refused
before admission carry lane `none`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

# 1 ms .. 60 s, roughly x1.5-2 per step: fine enough for 10 ms - 60 s latencies.
LATENCY_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2,
    0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
)  # fmt: skip
WAVE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
ROUND_BUCKETS_S = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1.0)


@dataclass(frozen=True, slots=True)
class ProxyMetrics:
    """All proxy metrics; build with `ProxyMetrics.create()` (fresh registry)."""

    registry: CollectorRegistry
    requests: Counter
    ttft: Histogram
    admission_wait: Histogram
    e2e_latency: Histogram
    queue_depth: Gauge
    inflight: Gauge
    pending_prefill: Gauge
    prefill_batch: Gauge
    inflight_limit: Gauge
    wave_size: Histogram
    releases: Counter
    prompt_tokens: Counter
    cached_tokens: Counter
    round_seconds: Histogram
    control_pushes: Counter
    control_failures: Counter
    control_up: Gauge
    backend_up: Gauge
    extraction: Counter
    session_calls: Counter
    sessions_paused: Gauge
    rendering_checks: Counter
    rendering_drift: Histogram
    tokenizer_verified: Gauge
    token_path_open: Gauge
    sessions_retained: Gauge
    prefill_pieces: Counter
    # per account (issue 36, `edge.account_metrics`); its gauges: `AccountCollector`
    account_requests: Counter
    account_tokens: Counter
    _children: dict[tuple[Any, tuple[str, ...]], Any] = field(default_factory=dict)

    def child(self, metric: Counter | Histogram, *values: str) -> Any:
        """`metric.labels(*values)`, looked up once per label set: `labels()` costs about
        1 µs a call and the token path makes seven per request."""
        key = (metric, values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

    @classmethod
    def create(cls) -> ProxyMetrics:
        r = CollectorRegistry(auto_describe=True)
        lane = ["lane"]
        return cls(
            registry=r,
            requests=Counter(
                "prism:requests",
                "Finished client requests by endpoint, lane and HTTP status",
                ["endpoint", "lane", "status"],
                registry=r,
            ),
            ttft=Histogram(
                "prism:ttft_seconds",
                "Time to first streamed token, as seen by the proxy",
                lane,
                buckets=LATENCY_BUCKETS_S,
                registry=r,
            ),
            admission_wait=Histogram(
                "prism:admission_wait_seconds",
                "Time from arrival to release by QAS",
                lane,
                buckets=LATENCY_BUCKETS_S,
                registry=r,
            ),
            e2e_latency=Histogram(
                "prism:e2e_latency_seconds",
                "Time from arrival to the end of the response",
                lane,
                buckets=LATENCY_BUCKETS_S,
                registry=r,
            ),
            queue_depth=Gauge("prism:queue_depth", "Requests waiting in QAS", registry=r),
            inflight=Gauge(
                "prism:inflight_requests", "Requests released and not finished", registry=r
            ),
            pending_prefill=Gauge(
                "prism:pending_prefill_requests",
                "Released requests whose first token has not come back (SPEC §2 pacing)",
                registry=r,
            ),
            prefill_batch=Gauge(
                "prism:prefill_batch",
                "B: released requests allowed to wait for their first token at once",
                registry=r,
            ),
            inflight_limit=Gauge(
                "prism:inflight_limit",
                "Backstop: released and unfinished requests allowed at once",
                registry=r,
            ),
            wave_size=Histogram(
                "prism:wave_size", "Requests released per round", buckets=WAVE_BUCKETS, registry=r
            ),
            releases=Counter(
                "prism:releases", "Requests released by QAS, by lane", lane, registry=r
            ),
            prompt_tokens=Counter(
                "prism:prompt_tokens", "Prompt tokens reported by the backend", lane, registry=r
            ),
            cached_tokens=Counter(
                "prism:cached_tokens",
                "Cached prompt tokens reported by the backend",
                lane,
                registry=r,
            ),
            prefill_pieces=Counter(
                "prism:prefill_pieces",
                "Prompt pieces prefilled ahead of their request (long uncached prompts)",
                registry=r,
            ),
            round_seconds=Histogram(
                "prism:qas_round_seconds",
                "CPU time of one QAS round (plan_round)",
                buckets=ROUND_BUCKETS_S,
                registry=r,
            ),
            control_pushes=Counter(
                "prism:control_rpc_pushes",
                "Priority tables accepted by the control RPC",
                registry=r,
            ),
            control_failures=Counter(
                "prism:control_rpc_failures", "Failed control RPC pushes", registry=r
            ),
            control_up=Gauge(
                "prism:control_rpc_up", "1 if the last control RPC push succeeded", registry=r
            ),
            backend_up=Gauge(
                "prism:backend_up", "1 if the last backend exchange succeeded", registry=r
            ),
            session_calls=Counter(
                "prism:session_calls",
                "Chats with tools by whether they continue a paused agent session (sessions on)",
                ["kind"],
                registry=r,
            ),
            sessions_paused=Gauge(
                "prism:sessions_paused",
                "Agent sessions paused on a tool call that the proxy remembers",
                registry=r,
            ),
            rendering_checks=Counter(
                "prism:prompt_rendering_checks",
                "Sampled chats on the token path whose prompt ids were compared with the "
                "engine's own rendering of the same chat (whole template, one tokenization): "
                "the same ids, or different ones",
                ["outcome"],
                registry=r,
            ),
            rendering_drift=Histogram(
                "prism:prompt_rendering_drift_tokens",
                "By how many tokens a sampled chat's prompt is longer or shorter than the "
                "engine's own rendering of it (absolute)",
                buckets=(0, 1, 2, 3, 5, 8, 13, 21, 50, 100),
                registry=r,
            ),
            tokenizer_verified=Gauge(
                "prism:tokenizer_verified",
                "The proxy's tokenizer against the engine's tokenization of probe texts and "
                "chats: 1 match, 0 mismatch, -1 unverified (the engine cannot tokenize, or "
                "did not answer the check)",
                ["tokenizer"],
                registry=r,
            ),
            token_path_open=Gauge(
                "prism:token_path_open",
                "1 while the proxy sends its own token ids (its tokenizer matched the "
                "engine's or is used unverified), 0 while they are refused or forwarded",
                registry=r,
            ),
            sessions_retained=Gauge(
                "prism:sessions_retained",
                "Paused agent sessions DART keeps for their client (retention earned by returns)",
                registry=r,
            ),
            account_requests=Counter(
                "prism:account_requests",
                "Finished requests of the generating endpoints by account (API key name; "
                "'addr' for all clients without keys; '(unauthenticated)' for 401s), HTTP "
                "status and, for 429s, the limit that refused them",
                ["account", "status", "limit"],
                registry=r,
            ),
            account_tokens=Counter(
                "prism:account_tokens",
                "Tokens of the answers of an account as the engine reported them, by kind "
                "(prompt, completion)",
                ["account", "kind"],
                registry=r,
            ),
            extraction=Counter(
                "prism:extraction",
                "Requests by where their segments came from: hints, documents found in the "
                "text (by layout, reordered or kept in order), or none",
                ["endpoint", "outcome", "layout"],
                registry=r,
            ),
        )

    def render(self) -> tuple[bytes, str]:
        """Prometheus text exposition and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


CacheStats = Mapping[str, int]  # entries, bytes, capacity_bytes; hits, misses if it has them


class CacheCollector(Collector):
    """Every cache the proxy keeps, read when Prometheus scrapes (no cost per request):
    `cache` is `chat_pieces` (rendered chats, `prism_tokens.chat_pieces`), `segments` and
    `heads` (the serializer's token ids, SPEC §1) or `view` (the policy's view of
    dispatched prompts, SPEC §5). Each is bounded in bytes by a setting."""

    def __init__(self, stats: Callable[[], Mapping[str, CacheStats]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        label = ["cache"]
        hits = CounterMetricFamily("prism:cache_hits", "Lookups a cache answered", labels=label)
        misses = CounterMetricFamily(
            "prism:cache_misses", "Lookups a cache could not answer", labels=label
        )
        entries = GaugeMetricFamily("prism:cache_entries", "Entries a cache holds", labels=label)
        held = GaugeMetricFamily("prism:cache_bytes", "Bytes a cache holds", labels=label)
        capacity = GaugeMetricFamily(
            "prism:cache_capacity_bytes", "Bytes a cache may hold (its setting)", labels=label
        )
        for cache, stats in self._stats().items():
            entries.add_metric([cache], stats["entries"])
            held.add_metric([cache], stats["bytes"])
            capacity.add_metric([cache], stats["capacity_bytes"])
            if "hits" in stats:
                hits.add_metric([cache], stats["hits"])
                misses.add_metric([cache], stats["misses"])
        yield from (hits, misses, entries, held, capacity)


AccountHoldings = Mapping[str, tuple[int, int]]  # account label -> (in flight, queued)


class AccountCollector(Collector):
    """Each account's requests in flight and queued, read when Prometheus scrapes (no
    cost per request; `edge.account_metrics.account_holdings`). Labels as
    `prism:account_requests`: bounded by the key file, or the one `addr` without keys."""

    def __init__(self, holdings: Callable[[], AccountHoldings]) -> None:
        self._holdings = holdings

    def collect(self) -> Iterator[Metric]:
        label = ["account"]
        inflight = GaugeMetricFamily(
            "prism:account_inflight_requests",
            "Requests of an account from their headers to their answer (POST: the "
            "generating endpoints), queued or at the engine",
            labels=label,
        )
        queued = GaugeMetricFamily(
            "prism:account_queued_requests",
            "Requests of an account waiting in QAS for release",
            labels=label,
        )
        for account, (open_requests, queued_requests) in self._holdings().items():
            inflight.add_metric([account], open_requests)
            queued.add_metric([account], queued_requests)
        yield from (inflight, queued)
