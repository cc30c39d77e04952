"""The twin: proxy admission and the simulated engine in one deterministic run in
modeled time (`prism-loadgen simulate`).

It drives the same objects as the real stack, with a discrete-event clock instead of
sockets and sleeps:

* the proxy's `AdmissionCore` (queue, rounds, waves, prefill pacing) and policies;
* the proxy's serializer and `TokenJob.payload`, so each request carries the very
  `input_ids` and `kv_hints` the proxy would send;
* prism-sim's `EngineCore` (scheduler, radix cache, DART extension), with the
  dispatch-batch priorities applied the moment a wave is released (the simulator's
  control RPC applies them inline too), and, when QAS weighs residency, DART's
  residency summary read every `residency_poll_s` as the proxy's poller does.

Without a policy it is native SGLang: requests go to the engine at their arrival,
serialized in the client's order (what `--api native` sends), and the engine's own
`schedule_policy` orders them.

Messages between the proxy (or a native client) and the engine take `hop_s` (1 ms by
default, about a loopback HTTP message under load here): a released request reaches
the engine one hop after its round, a first token or a finish reaches the core one hop
after the engine produced it, and a client's TTFT counts that last hop. The hop
matters: with none, each wave would reach the engine the instant the previous prefill
ended, and prefill (which SGLang runs before decode) would starve decoding; on the real
stack the engine starts a decode step in between.

Event order at one instant: a finished batch, then deliveries (in the order they were
sent), then arrivals, then a due round, then the next batch if the engine is idle.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from backend_plugin.dart.priority import PriorityUpdate
from loadgen.clients.apis import chat_messages, client_order_ids, token_job
from loadgen.clients.summary import RequestRecord, summarize
from loadgen.workloads.trace_format import Trace, TraceRequest
from prism_proxy.admission.core import AdmissionCore, BackendLimits, Wave
from prism_proxy.api.chat import ChatCompletionRequest
from prism_proxy.config import ProxyConfig
from prism_proxy.prompts.evidence import BlockEvidence
from prism_proxy.prompts.jobs import TokenJob
from prism_proxy.prompts.plan import Forward, PlanContext, plan_chat
from prism_proxy.prompts.serializer import Serializer
from prism_proxy.prompts.tool_results import ToolResults
from prism_proxy.qas.params import QasParams
from prism_proxy.qas.residency import ResidentSegments, residency_source
from prism_proxy.scheduling import admission_core, dart_resident_sets
from prism_sim.engine import EngineCore, SimConfig
from prism_sim.host_tier import DEFAULT_HICACHE_BANDWIDTH_GBPS, DEFAULT_HICACHE_RATIO
from prism_sim.native_api import batch_limits
from prism_sim.request import SimRequest
from prism_sim.time_model import DEFAULT_PROFILE
from prism_tokens.tokenizer import Tokenizer


@dataclass(frozen=True)
class TwinSetup:
    """One twin run: the proxy's settings (`policy=None`: no proxy) and the engine's."""

    policy: str | None
    eviction: str = "lru"
    # SGLang's --radix-eviction-policy-config (e.g. tlru's threshold)
    eviction_config: dict[str, Any] | None = None
    schedule_policy: str = "fcfs"
    qas: QasParams = field(default_factory=QasParams)
    prefill_batch: int | None = None  # None: automatic, as in the proxy
    max_inflight: int | None = None
    window_s: float = 0.010
    protect: int = 8
    protect_fraction: float | None = None  # DART's bound on F_t (None: the default)
    profile: str = DEFAULT_PROFILE
    kv_capacity_tokens: int | None = None
    seed: int = 0
    hop_s: float = 0.001
    residency_poll_s: float = 0.05  # the proxy's ResidencyPoller interval
    # None: hinted requests; else plain chat with the documents in this layout, found
    # as the proxy plans them at its defaults (`prompts.plan.plan_chat`)
    layout: str | None = None
    # SGLang's hierarchical cache (`prism_sim.host_tier`) when True: a host pool of
    # `hicache_ratio` × the device pool, loads at `hicache_bandwidth_gbps` GB/s
    hicache: bool = False
    hicache_ratio: float = DEFAULT_HICACHE_RATIO
    hicache_bandwidth_gbps: float = DEFAULT_HICACHE_BANDWIDTH_GBPS

    def sim_config(self) -> SimConfig:
        return SimConfig(
            profile=self.profile,
            kv_capacity_tokens=self.kv_capacity_tokens,
            schedule_policy=self.schedule_policy,
            eviction=self.eviction,
            seed=self.seed,
            protect_fraction=self.protect_fraction,
            radix_eviction_policy_config=self.eviction_config,
            enable_hierarchical_cache=self.hicache,
            hicache_ratio=self.hicache_ratio,
            hicache_bandwidth_gbps=self.hicache_bandwidth_gbps,
        )

    def proxy_config(self) -> ProxyConfig:
        """The proxy's settings this run stands for (`policy` set): its defaults with
        this run's policy, QAS parameters, pacing, round window and protect."""
        assert self.policy is not None
        return replace(
            PROXY_DEFAULTS,
            policy=self.policy,
            qas=self.qas,
            prefill_batch=self.prefill_batch,
            max_inflight=self.max_inflight,
            window_ms=self.window_s * 1000.0,
            protect=self.protect,
        )


PROXY_DEFAULTS = ProxyConfig(backend="http://twin")  # the proxy's settings at their defaults


@dataclass
class _Tracked:
    request: TraceRequest
    job: TokenJob | None = None
    sim: SimRequest | None = None
    lane: str | None = None
    error: str | None = None
    # the tokens the engine generates (`SimRequest.output_script`; None: filler)
    output_script: list[int] | None = None
    # served by the engine's own endpoint (`prompts.plan.Forward`): the proxy learns its
    # uncached tokens from the answer's usage at its end, not from its first token
    engine_served: bool = False


class Twin:
    """State of one run; `run()` plays the whole trace."""

    def __init__(
        self, trace: Trace, setup: TwinSetup, tokenizer: Tokenizer, max_queue: int | None = None
    ) -> None:
        self.trace = trace
        self.setup = setup
        self.now = 0.0
        self.engine = EngineCore.build(setup.sim_config(), tokenizer, clock=lambda: self.now)
        self.scheduler = self.engine.scheduler
        self.serializer = Serializer(tokenizer)
        self.evidence = BlockEvidence(PROXY_DEFAULTS.evidence_cache_bytes)
        self.tool_results = ToolResults(PROXY_DEFAULTS.evidence_cache_bytes)
        self.context: PlanContext | None = None
        self.core: AdmissionCore | None = None
        dart = getattr(self.engine.extension, "core", None)
        self.dart = dart if setup.policy == "prism" else None  # only prism pushes P̂_t
        self.resident: ResidentSegments | None = None
        self._next_poll = 0.0
        if setup.policy is not None:
            config = setup.proxy_config()
            # the proxy's own assembly (`prism_proxy.scheduling`), with the modeled clock
            self.core = admission_core(config, max_queue=max_queue or len(trace.requests) + 1)
            self.core.learn_backend(BackendLimits.from_server_info(batch_limits(self.scheduler)))
            sources = 1 if self.dart is not None else 0  # as the proxy with DART
            sets = dart_resident_sets(self.core.policy, config, sources, clock=lambda: self.now)
            self.resident = sets[0] if sets else None
            # what a chat's plan depends on, as the proxy's edge gives it one client
            self.context = PlanContext(
                serializer=self.serializer,
                layouts=tuple(config.extraction_layouts),
                reorder=config.extraction_reorder,
                evidence=self.evidence.scoped(""),
                tool_results=self.tool_results if self.core.policy.reorders else None,
                sessions=config.sessions,
            )
        self.epoch = 0
        self.tracked: dict[str, _Tracked] = {}
        self.waves: list[int] = []
        # Messages in flight: (delivery time, send order, action).
        self._deliveries: list[tuple[float, int, Callable[[], None]]] = []
        self._sent = itertools.count()
        # Arrivals not yet due: (time, order, item), handed to `_arrive` when due.
        self._arrivals: list[tuple[float, int, Any]] = [
            (r.arrival, n, r) for n, r in enumerate(trace.requests)
        ]
        self._arrival_order = itertools.count(len(self._arrivals))

    def schedule_arrival(self, when: float, item: Any) -> None:
        """`item` reaches `_arrive` at `when` (closed-loop clients schedule their next
        call as the previous one ends)."""
        heapq.heappush(self._arrivals, (when, next(self._arrival_order), item))

    def _send(self, action: Callable[[], None]) -> None:
        """Deliver `action` one hop from now."""
        when = self.now + self.setup.hop_s
        heapq.heappush(self._deliveries, (when, next(self._sent), action))

    # --- proxy side ------------------------------------------------------------------
    def _arrive(self, request: TraceRequest) -> None:
        tracked = _Tracked(request)
        self.tracked[request.rid] = tracked
        if self.core is None:
            ids = client_order_ids(request, self.serializer)
            sim = SimRequest(request.rid, ids, request.max_tokens, self.now)
            self._send(lambda: self._submit(tracked, sim))
            return
        if self.setup.layout is None:
            tracked.job = token_job(request, self.serializer)
        else:
            # the chat as the proxy's edge plans it (`prompts.plan`), at its defaults
            messages = chat_messages(request, self.setup.layout)
            body = {"model": "twin", "messages": messages}
            assert self.context is not None
            plan = plan_chat(ChatCompletionRequest.model_validate(body), body, self.context)
            job = plan.job if isinstance(plan, Forward) else plan
            if job is None:
                raise ValueError(
                    f"{request.rid}: the proxy would forward this chat unscheduled "
                    f"({plan.origin}); the twin models scheduled requests only"
                )
            tracked.job = job
            tracked.engine_served = isinstance(plan, Forward)
        self.core.arrive(tracked.job.queued(request.rid, request.arrival), self.now)

    def _release(self, wave: Wave) -> None:
        if self.dart is not None and wave.released and wave.dispatch_priorities:
            self.epoch += 1
            update = PriorityUpdate(self.epoch, dict(wave.dispatch_priorities), self.setup.protect)
            self.dart.inbox.submit(update)
            self.dart.apply_pending()
        self.waves.append(len(wave.released))
        for release in wave.released:
            tracked = self.tracked[release.rid]
            assert tracked.job is not None
            payload = tracked.job.payload(
                release.skeleton,
                rid=release.rid,
                priorities=release.priorities,
                sampling_params={"max_new_tokens": tracked.request.max_tokens},
            )
            tracked.lane = release.lane.value
            sim = SimRequest(
                release.rid,
                payload["input_ids"],
                tracked.request.max_tokens,
                self.now,
                kv_hints=payload.get("kv_hints"),
                output_script=tracked.output_script,
            )
            self._send(lambda tracked=tracked, sim=sim: self._submit(tracked, sim))

    def _submit(self, tracked: _Tracked, sim: SimRequest) -> None:
        tracked.sim = sim
        sim.listener = self._on_progress
        try:
            self.scheduler.add_request(sim, self.now)
        except ValueError as exc:  # too long for the KV pool: the backend's 400
            tracked.error = f"HTTP 400: {exc}"
            if self.core is not None:
                self._send(lambda: self.core.finish(sim.rid))

    def _on_progress(self, sim: SimRequest) -> None:
        """A token or the finish of `sim` (called by the scheduler): the news reaches
        the core one hop later."""
        core = self.core
        if core is None:
            return
        first = len(sim.output_ids) == 1 or (sim.finished and not sim.output_ids)
        if not (first or sim.finished):
            return  # a decode step: nothing the proxy hears of
        tracked = self.tracked.get(sim.rid)
        later = tracked is not None and tracked.engine_served  # told with the usage
        uncached = len(sim.input_ids) - sim.cached_tokens
        if first:
            told = None if later else uncached
            self._send(lambda: core.first_token(sim.rid, told, self.now))
        if sim.finished:
            if later:
                self._send(lambda: core.observe_uncached(uncached))
            self._send(lambda: core.finish(sim.rid))

    def _poll_residency(self) -> None:
        """What the proxy's `ResidencyPoller` does: DART's summary every `poll_s`,
        a hop old when it arrives (read here, at a round, when one is due)."""
        if self.resident is None or self.dart is None or self.now < self._next_poll:
            return
        self.resident.apply(
            self.dart.residency_summary(self.resident.generation, self.resident.version)
        )
        self._next_poll = self.now + self.setup.residency_poll_s

    # --- the event loop --------------------------------------------------------------
    def run(self) -> list[RequestRecord]:
        scheduler, core, deliveries = self.scheduler, self.core, self._deliveries
        arrivals = self._arrivals
        batch = None
        batch_end = math.inf
        while True:
            next_arrival = arrivals[0][0] if arrivals else math.inf
            due = core.next_round_at(self.now) if core is not None else None
            next_round = math.inf if due is None else due
            next_delivery = deliveries[0][0] if deliveries else math.inf
            t = min(batch_end, next_delivery, next_arrival, next_round)
            if t == math.inf:
                break
            self.now = max(self.now, t)
            if batch is not None and batch_end <= self.now:
                scheduler.complete_batch(batch, self.now)
                batch, batch_end = None, math.inf
            while deliveries and deliveries[0][0] <= self.now:
                heapq.heappop(deliveries)[2]()
            while arrivals and arrivals[0][0] <= self.now:
                self._arrive(heapq.heappop(arrivals)[2])
            if core is not None:
                due = core.next_round_at(self.now)
                if due is not None and due <= self.now:
                    self._poll_residency()
                    wave = core.run_round(self.now)
                    if wave is not None:
                        self._release(wave)
            if batch is None:
                batch = scheduler.next_batch(self.now)
                if batch is not None:
                    batch_end = self.now + batch.duration_s
        return [self._record(t) for t in self.tracked.values()]

    def _record(self, tracked: _Tracked) -> RequestRecord:
        request, sim = tracked.request, tracked.sim
        ok = (
            tracked.error is None
            and sim is not None
            and sim.first_token_s is not None
            and sim.finish_s is not None
        )
        error = tracked.error or (None if ok else "not served")
        hop = self.setup.hop_s
        return RequestRecord(
            rid=request.rid,
            arrival_s=request.arrival,
            send_lag_ms=0.0,
            success=ok,
            ttft_ms=(sim.first_token_s + hop - request.arrival) * 1e3 if ok and sim else None,
            e2e_latency_ms=(sim.finish_s + hop - request.arrival) * 1e3 if ok and sim else None,
            prompt_tokens=len(sim.input_ids) if sim else None,
            completion_tokens=len(sim.output_ids) if sim else None,
            cached_tokens=sim.cached_tokens if sim else None,
            hot=request.hot,
            lane=tracked.lane,
            status=200 if ok else None,
            error=error,
        )

    def engine_state(self) -> dict[str, Any]:
        stats = self.scheduler.stats
        dart = getattr(self.engine.extension, "core", None)
        return {
            "evicted_tokens_total": self.engine.cache.evicted_tokens_total,
            "prefill_steps": stats.prefill_steps,
            "decode_steps": stats.decode_steps,
            "kv_overcommit_tokens": stats.kv_overcommit_tokens,
            "radix_eviction_policy": self.setup.eviction,
            "modeled_time_s": self.now,
            "dart": None if dart is None else dart.stats().as_dict(),
            **self._host_tier_state(),
        }

    def _host_tier_state(self) -> dict[str, Any]:
        """The host tier's counters (nothing without one, so device-only results keep
        their keys)."""
        host = self.engine.host_tier
        if host is None:
            return {}
        stats = self.scheduler.stats
        return {
            "host_tier": {
                "capacity_tokens": host.config.capacity_tokens,
                "bandwidth_bytes_per_s": host.config.bandwidth_bytes_per_s,
                "bytes_per_token": host.config.bytes_per_token,
                "prompt_tokens_total": stats.prompt_tokens_total,
                "cached_tokens_total": stats.cached_tokens_total,
                "host_hit_tokens_total": stats.host_hit_tokens_total,
                "host_load_s_total": stats.host_load_s_total,
                "backed_up_tokens_total": host.backed_up_tokens_total,
                "host_evicted_tokens_total": host.host_evicted_tokens_total,
                "dropped_device_copies_tokens_total": host.failed_backup_tokens_total,
                "host_size_tokens_final": host.size_tokens(),
            }
        }


def simulate(trace: Trace, setup: TwinSetup, tokenizer: Tokenizer) -> dict[str, Any]:
    """Play `trace` through the twin; the results document of `loadgen.clients.replay`."""
    twin = Twin(trace, setup, tokenizer)
    records = twin.run()
    finished = [r.arrival_s + (r.e2e_latency_ms or 0.0) / 1e3 for r in records if r.success]
    duration_s = max(finished, default=0.0)
    qps = trace.header.params.get("qps")
    pacing = twin.core.pacing if twin.core is not None else None
    waves = twin.waves
    return {
        "config": {"twin": {**asdict(setup), "qas": asdict(setup.qas)}},
        "trace": trace.header.to_json(),
        "summary": summarize(records, duration_s, float(qps) if qps else None),
        "requests": [r.to_json() for r in records],
        "engine_state": twin.engine_state(),
        "proxy_state": None
        if pacing is None
        else {
            "prefill_batch_final": pacing.prefill_batch,
            "backstop": pacing.backstop,
            "uncached_tokens_ewma": pacing.uncached_tokens,
            "rounds_with_release": len(waves),
            "mean_wave_size": sum(waves) / len(waves) if waves else 0.0,
            "residency": residency_source(twin.core.policy) if twin.core else "none",
            "control_rpc": twin.dart is not None,  # P̂_t applied to DART inline
        },
    }
