"""Value types of the simulated engine's scheduler: limits, batches, counters (SPEC §7)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prism_sim.request import SimRequest
from prism_sim.schedule_policy import validate_policy
from prism_sim.time_model import Profile


@dataclass(frozen=True)
class SchedulerConfig:
    """Engine limits; `chunked_prefill_size=None` disables chunking (no token budget)."""

    kv_capacity_tokens: int
    max_running_requests: int
    chunked_prefill_size: int | None
    schedule_policy: str = "fcfs"
    # SGLang refreshes waiting requests' prefixes only under LRU eviction.
    waiting_prefix_refresh: bool = False

    def __post_init__(self) -> None:
        validate_policy(self.schedule_policy)
        if self.kv_capacity_tokens <= 0 or self.max_running_requests <= 0:
            raise ValueError("kv_capacity_tokens and max_running_requests must be positive")
        if self.chunked_prefill_size is not None and self.chunked_prefill_size <= 0:
            raise ValueError("chunked_prefill_size must be positive or None")

    @classmethod
    def from_profile(
        cls, profile: Profile, schedule_policy: str = "fcfs", eviction: str = "lru"
    ) -> SchedulerConfig:
        return cls(
            kv_capacity_tokens=profile.kv_capacity_tokens,
            max_running_requests=profile.max_running_requests,
            chunked_prefill_size=profile.chunked_prefill_size,
            schedule_policy=schedule_policy,
            waiting_prefix_refresh=eviction.lower() == "lru",
        )


@dataclass(frozen=True)
class PrefillPart:
    req: SimRequest
    extend_tokens: int
    load_tokens: int = 0  # host-tier tokens copied to the device before this prefill


@dataclass(frozen=True)
class Batch:
    """One forward pass: a prefill of `parts` or a decode step over `decode_reqs`."""

    kind: Literal["prefill", "decode"]
    started_s: float
    duration_s: float
    parts: tuple[PrefillPart, ...] = ()
    decode_reqs: tuple[SimRequest, ...] = ()

    @property
    def size(self) -> int:
        return len(self.parts) if self.kind == "prefill" else len(self.decode_reqs)


@dataclass
class SchedulerStats:
    """Cumulative counters (SGLang's metric names in `prism_sim.metrics`)."""

    prompt_tokens_total: int = 0
    cached_tokens_total: int = 0
    generation_tokens_total: int = 0
    num_requests_total: int = 0
    num_aborted_total: int = 0
    processed_prefill_tokens: int = 0  # uncached tokens prefilled (HRRN's token clock)
    kv_overcommit_tokens: int = 0  # allocations the pool could not cover (should stay 0)
    host_hit_tokens_total: int = 0  # of cached_tokens_total, loaded back from host
    host_load_s_total: float = 0.0  # modeled host→device copy time charged to prefills
    last_prefill_hit_rate: float = 0.0
    prefill_steps: int = 0
    decode_steps: int = 0
