"""The simulated engine assembled: tokenizer, radix cache, scheduler, loop, metrics.

`SimConfig` is what the CLI parses; `SimEngine.start(...)` queues one request and
returns a `RequestHandle` the HTTP handlers follow token by token (SPEC §7).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from prism_sim.engine_loop import EngineLoop
from prism_sim.eviction import EvictionStrategy, make_eviction_strategy
from prism_sim.extensions import load_extension
from prism_sim.host_tier import (
    DEFAULT_HICACHE_BANDWIDTH_GBPS,
    DEFAULT_HICACHE_RATIO,
    WRITE_POLICIES,
    HostTier,
    HostTierConfig,
    host_capacity_tokens,
)
from prism_sim.metrics import EngineMetrics
from prism_sim.radix_cache import RadixCache
from prism_sim.request import SimRequest
from prism_sim.scheduler import InsertHook, Scheduler, SchedulerConfig
from prism_sim.time_model import DEFAULT_PROFILE, Profile, load_profile
from prism_tokens.tokenizer import Tokenizer, load_tokenizer

FILLER_TEXT = (
    " The quick brown fox jumps over the lazy dog while the river runs past the old mill"
    " and the children count the boats that sail toward the far north shore."
)
VERSION = "0.5.23"


@dataclass(frozen=True)
class SimConfig:
    """Everything `python -m prism_sim` accepts (None: take the profile's value)."""

    host: str = "127.0.0.1"
    port: int = 30000
    tokenizer: str | None = None
    profile: str = DEFAULT_PROFILE
    kv_capacity_tokens: int | None = None
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    schedule_policy: str = "fcfs"
    eviction: str = "lru"
    # SGLang's --radix-eviction-policy-config: keyword arguments for the eviction
    # strategy (slru: protected_threshold; tlru: threshold, next_prompt_estimate).
    radix_eviction_policy_config: dict[str, Any] | None = None
    speed: float = 1.0
    seed: int = 0
    served_model_name: str | None = None
    incremental_streaming_output: bool = False
    control_port: int | None = None
    control_token: str | None = field(default=None, repr=False)
    protect_fraction: float | None = None  # DART: share of the KV pool F_t may hold
    # A chat answer that calls no tool: this text, then the stop token (a model that
    # answers briefly and stops), instead of filler up to the request's max tokens.
    answer_text: str | None = None
    # SGLang's `--api-key`: the bearer token its API requires (health, readiness and
    # metrics excepted, as in SGLang 0.5.23's `utils/auth.py`); None: open.
    api_key: str | None = field(default=None, repr=False)
    # SGLang's hierarchical cache (`prism_sim.host_tier`): a host pool of
    # `hicache_ratio` × the device pool (or `hicache_size` GB), written through, loaded
    # back at `hicache_bandwidth_gbps` GB/s (not an SGLang flag: the PCIe link's rate).
    enable_hierarchical_cache: bool = False
    hicache_ratio: float = DEFAULT_HICACHE_RATIO
    hicache_size: float = 0.0
    hicache_write_policy: str = "write_through"
    hicache_bandwidth_gbps: float = DEFAULT_HICACHE_BANDWIDTH_GBPS

    def __post_init__(self) -> None:
        if self.speed <= 0:
            raise ValueError("speed must be positive")
        if self.protect_fraction is not None and not 0.0 <= self.protect_fraction <= 1.0:
            raise ValueError("protect_fraction must be in [0, 1]")
        if self.enable_hierarchical_cache:
            if self.hicache_ratio <= 0 and self.hicache_size <= 0:
                raise ValueError("--hicache-ratio or --hicache-size must be positive")
            if self.hicache_bandwidth_gbps <= 0:
                raise ValueError("--hicache-bandwidth-gbps must be positive")
            if self.hicache_write_policy not in WRITE_POLICIES:
                raise ValueError(
                    f"--hicache-write-policy {self.hicache_write_policy!r} is not modeled "
                    f"(modeled: {', '.join(WRITE_POLICIES)})"
                )
        policy_config = self.radix_eviction_policy_config
        if policy_config is not None and not isinstance(policy_config, dict):
            raise ValueError("radix_eviction_policy_config must be a JSON object")
        if self.eviction.lower() == "tlru":
            # SGLang 0.5.23's startup check (arg_groups/kv_cache_hook.py), its words.
            tlru_config = self.radix_eviction_policy_config or {}
            threshold = tlru_config.get("threshold", 0)
            next_prompt_estimate = tlru_config.get("next_prompt_estimate", 0)
            if threshold < 0 or next_prompt_estimate < 0:
                raise ValueError(
                    "--radix-eviction-policy tlru requires non-negative 'threshold' and "
                    "'next_prompt_estimate' in --radix-eviction-policy-config, got "
                    f"{threshold} and {next_prompt_estimate}."
                )
            if threshold <= next_prompt_estimate:
                raise ValueError(
                    "--radix-eviction-policy tlru needs 'threshold' greater than "
                    "'next_prompt_estimate' in --radix-eviction-policy-config, got "
                    f"{threshold} <= {next_prompt_estimate}; otherwise no tokens are "
                    "ever TEL-safe and T-LRU is exactly LRU."
                )

    def eviction_strategy(self) -> EvictionStrategy:
        """The built-in strategy `eviction` names, built with
        `radix_eviction_policy_config` as keyword arguments (SGLang's
        `get_eviction_strategy`); ValueError for an unknown name or keyword."""
        kwargs = self.radix_eviction_policy_config or {}
        try:
            return make_eviction_strategy(self.eviction, **kwargs)
        except TypeError as exc:  # an unknown keyword, named by Python
            raise ValueError(
                f"--radix-eviction-policy-config {kwargs!r} does not fit "
                f"--radix-eviction-policy {self.eviction!r}: {exc}"
            ) from None

    def host_tier_config(self, profile: Profile) -> HostTierConfig | None:
        """The host tier's settings (None unless `enable_hierarchical_cache`)."""
        if not self.enable_hierarchical_cache:
            return None
        return HostTierConfig(
            capacity_tokens=host_capacity_tokens(
                profile.kv_capacity_tokens,
                self.hicache_ratio,
                self.hicache_size,
                profile.kv_bytes_per_token,
            ),
            bytes_per_token=profile.kv_bytes_per_token,
            bandwidth_bytes_per_s=self.hicache_bandwidth_gbps * 1e9,
            write_policy=self.hicache_write_policy,
        )

    def resolved_profile(self) -> Profile:
        profile = load_profile(self.profile).with_overrides(
            kv_capacity_tokens=self.kv_capacity_tokens,
            max_running_requests=self.max_running_requests,
        )
        if self.chunked_prefill_size is not None:
            # A non-positive size disables chunked prefill, as -1 does in SGLang.
            chunk = self.chunked_prefill_size if self.chunked_prefill_size > 0 else None
            profile = replace(profile, chunked_prefill_size=chunk)
        return profile


class RequestHandle:
    """Follows one request: `progress()` yields whenever tokens arrive or it finishes."""

    def __init__(self, req: SimRequest, engine: SimEngine) -> None:
        self.req = req
        self.engine = engine
        self._changed = asyncio.Event()
        self._every_token = True
        req.listener = self._on_change

    def _on_change(self, req: SimRequest) -> None:
        if self._every_token or req.finished:
            self._changed.set()

    async def progress(self) -> AsyncIterator[SimRequest]:
        seen = 0
        while True:
            done = self.req.finished
            if len(self.req.output_ids) != seen or done:
                seen = len(self.req.output_ids)
                yield self.req
            if done:
                return
            await self._changed.wait()
            self._changed.clear()

    async def wait(self) -> SimRequest:
        """Wait for the finish only (no wake-up per token)."""
        self._every_token = False
        async for _ in self.progress():
            pass
        return self.req

    def abort(self) -> None:
        if not self.req.finished:
            self.engine.loop.abort(self.req.rid)


@dataclass
class EngineCore:
    """A simulated engine without HTTP or clock: radix cache, DART extension (if the
    eviction order needs one) and scheduler, wired together (SPEC §7).

    The real-time engine (`SimEngine`) and the modeled-time twin (`loadgen.twin.twin`) both
    build theirs here, so they run the same code. `finish_hooks` are called once per
    request when it finishes or is aborted.
    """

    profile: Profile
    cache: RadixCache
    extension: Any
    scheduler: Scheduler
    finish_hooks: list[Callable[[SimRequest], None]]
    host_tier: HostTier | None = None

    @classmethod
    def build(
        cls,
        config: SimConfig,
        tokenizer: Tokenizer,
        *,
        insert_hook: InsertHook | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> EngineCore:
        profile = config.resolved_profile()
        specials = {tokenizer.eos_token_id}
        filler = [t for t in tokenizer.encode(FILLER_TEXT) if t not in specials]
        shift = config.seed % len(filler)
        extension = load_extension(config.eviction, config)
        if extension is not None and config.radix_eviction_policy_config:
            raise ValueError(
                f"--radix-eviction-policy-config is for SGLang's own policies, "
                f"not {config.eviction!r}"
            )
        hooks = [h for h in (insert_hook, extension and extension.on_insert) if h]
        strategy = extension.strategy if extension else config.eviction_strategy()
        cache = RadixCache(strategy, clock=clock)
        if extension is not None:
            extension.attach(cache)
        host_config = config.host_tier_config(profile)
        # The device tree and its eviction order are untouched: DART (or any order)
        # still picks what leaves the device; the host tier only keeps a copy.
        host_tier = HostTier(host_config, cache) if host_config is not None else None
        attach_host = getattr(extension, "attach_host", None)
        if host_tier is not None and attach_host is not None:
            attach_host(host_tier.host)  # e.g. DART orders the host tier's evictions too

        def on_insert(req: SimRequest, cache: RadixCache, key: list[int]) -> None:
            for hook in hooks:
                hook(req, cache, key)

        scheduler = Scheduler(
            SchedulerConfig.from_profile(profile, config.schedule_policy, config.eviction),
            profile,
            cache,
            filler[shift:] + filler[:shift],
            insert_hook=on_insert if hooks else None,
            host_tier=host_tier,
        )
        finish_hooks: list[Callable[[SimRequest], None]] = []
        ext_on_finish = getattr(extension, "on_finish", None)
        if ext_on_finish is not None:
            finish_hooks.append(ext_on_finish)

        def on_finish(req: SimRequest) -> None:
            for hook in finish_hooks:
                hook(req)

        scheduler.on_finish = on_finish
        return cls(profile, cache, extension, scheduler, finish_hooks, host_tier)


class SimEngine:
    """One simulated SGLang server's state (no HTTP here)."""

    def __init__(
        self,
        config: SimConfig,
        tokenizer: Tokenizer | None = None,
        insert_hook: InsertHook | None = None,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer or load_tokenizer(config.tokenizer)
        core = EngineCore.build(config, self.tokenizer, insert_hook=insert_hook)
        self.profile, self.cache, self.scheduler = core.profile, core.cache, core.scheduler
        self.extension = core.extension
        self.model_name = config.served_model_name or self.profile.model_name
        self.model_path = config.tokenizer or self.profile.model_name
        # SGLang's `/server_info` `startup_time`: a client sees from it that the engine
        # restarted (the proxy then checks its tokenizer again).
        self.startup_time = time.time()
        self.loop = EngineLoop(self.scheduler, speed=config.speed)
        self.metrics = EngineMetrics(self.scheduler, self.model_name, self.loop.now)
        core.finish_hooks.insert(0, self.metrics.observe_finished)
        log_path = os.environ.get("PRISM_SIM_REQUEST_LOG")
        if log_path:  # a diagnostic: each finished request's timeline, one JSON a line
            log_file = open(log_path, "a", buffering=1)  # noqa: SIM115 (the server's life)
            core.finish_hooks.append(lambda req: log_file.write(json.dumps(req.timeline()) + "\n"))

    def start(
        self,
        input_ids: list[int],
        max_new_tokens: int,
        rid: str | None = None,
        kv_hints: dict[str, Any] | None = None,
        priority: int | None = None,
        custom_params: dict[str, Any] | None = None,
        stream: bool = False,
        output_script: list[int] | None = None,
    ) -> RequestHandle:
        """Queue a request (ValueError when it can never fit or the rid is in use).
        `output_script`: the tokens to generate instead of filler (`SimRequest`)."""
        if output_script is not None and not output_script:
            raise ValueError("output_script must not be empty")
        req = SimRequest(
            rid=rid or uuid.uuid4().hex,
            input_ids=list(input_ids),
            max_new_tokens=max_new_tokens,
            arrival_s=self.loop.now(),
            kv_hints=kv_hints,
            custom_params=custom_params,
            priority=priority,
            stream=stream,
            output_script=output_script,
        )
        handle = RequestHandle(req, self)
        self.loop.submit(req)
        return handle

    def decode(self, ids: list[int]) -> str:
        """Text of generated ids without special tokens (SGLang's `skip_special_tokens`
        default): an answer's stop token is not part of its text."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)
