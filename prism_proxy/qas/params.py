"""QAS parameters with the SPEC's defaults (SPEC §2, §5)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True, slots=True)
class QasParams:
    """Every knob of QAS and the baselines; defaults are the paper's.

    * `f_front`: segments moved to the front of each reorderable skeleton.
    * `kappa`: signature size κ.
    * `q_cold`: cold-lane slots per wave.
    * `alpha_size`, `beta_util`: bucket score weights.
    * `w_a`, `w_n`, `w_g`: active / next / global counter weights of P_t.
    * `k`: k-LPM's group size (`klpm` only).
    * `cache_view_tokens`: capacity of the baselines' approximate cache view (SPEC §5),
      and of `prism`'s own view when it learns residency without DART.
    * `cache_view_bytes`: the memory that view may take in the proxy, whatever the
      tokens (many one-token segments with long ids would otherwise cost far more).

    Beyond the paper (`paper` in `QAS_VARIANTS` turns all three off):

    * `canonical_ties`: equal priorities break by a stable global order of segment ids
      (`canonical_key`), not by position.
    * `w_c`: P_t weight of residency c_t(r) ∈ {0, 1} (0: residency unused).
    * `cold_deadline_ms`: a request that has waited this long joins the cold lane ahead
      of FIFO order, earliest deadline first (0: off; a TTFT SLO sets its own).
    * `cold_max_fraction`: while such requests wait, the cold lane grows from `q_cold`
      up to this fraction of the wave.
    * `continuation_share`: the share of the hot lane that continuations of paused
      agent sessions take first, oldest program first (program-level continuity); the
      rest of the hot lane and the cold lane are filled as before, so new sessions keep
      at least the other hot slots and the cold lane. Only requests the proxy's session
      features mark (`QueuedRequest.program_start`) count; 0: off, the default: on
      agent_sessions it cost P99 TTFT and bought no JCT (docs/results/agent-sessions).
    * `backlog_ms`: once the oldest queued request has waited this long (the queue is
      backing up), a round releases first the requests that waited `age_cap_ms`
      (oldest first), then the others by their cached prefix, longest first (the head
      and the run of the skeleton that the cache view and the resident set say is
      cached): SGLang's `lpm` order, here over the proxy's whole queue, with an age cap
      on the requests it passes over. Buckets and the deadline lane wait until the
      backlog clears. On agent sessions past the engine's capacity it finishes started
      programs first (their histories are the long cached prefixes), so fewer
      histories are live at once. 0: off, the default.
    * `age_cap_ms`: under a backlog, the longest a request is passed over.
    """

    f_front: int = 3
    kappa: int = 1
    q_cold: int = 2
    alpha_size: float = 1.0
    beta_util: float = 0.5
    w_a: float = 1e6
    w_n: float = 1e5
    w_g: float = 1.0
    k: int = 2
    cache_view_tokens: int = 400_000
    cache_view_bytes: int = 64 * 1024 * 1024
    canonical_ties: bool = False
    w_c: float = 0.0
    cold_deadline_ms: float = 0.0
    cold_max_fraction: float = 0.5
    continuation_share: float = 0.0
    backlog_ms: float = 0.0
    age_cap_ms: float = 8000.0

    def __post_init__(self) -> None:
        if self.cache_view_bytes < 1:
            raise ValueError(f"cache_view_bytes must be >= 1, got {self.cache_view_bytes}")
        for name in ("f_front", "kappa", "q_cold", "cache_view_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        for name in ("w_c", "cold_deadline_ms", "backlog_ms", "age_cap_ms"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("cold_max_fraction", "continuation_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")

    def cold_quota(self, wave_size: int, overdue: int) -> int:
        """Cold-lane slots of a wave of `wave_size` with `overdue` requests past their
        deadline: q_cold, grown to cover them up to ⌊cold_max_fraction · M⌋."""
        ceiling = max(self.q_cold, int(self.cold_max_fraction * wave_size))
        return min(max(self.q_cold, overdue), ceiling)

    @property
    def cold_deadline_s(self) -> float | None:
        """The admission wait after which a request is late, in seconds (None: off)."""
        return self.cold_deadline_ms / 1000.0 if self.cold_deadline_ms > 0 else None

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_overrides(cls, overrides: dict[str, Any]) -> QasParams:
        """Build from a partial mapping; unknown names and wrong types raise ValueError."""
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for name, value in overrides.items():
            if name not in known:
                raise ValueError(f"params.{name}: unknown parameter")
            default = getattr(cls(), name)
            if isinstance(default, bool):
                if not isinstance(value, bool):
                    raise ValueError(f"params.{name}: expected true or false, got {value!r}")
                values[name] = value
                continue
            expected = int if isinstance(default, int) else float
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"params.{name}: expected a number, got {value!r}")
            if expected is int and float(value) != int(value):
                raise ValueError(f"params.{name}: expected an integer, got {value!r}")
            values[name] = expected(value)
        try:
            return cls(**values)
        except ValueError as exc:
            raise ValueError(f"params.{exc}") from None


# Residency weight: c_t ranks between next-batch demand (w_n = 1e5) and queued prevalence
# (w_g = 1): a resident segment outranks any segment queued by fewer than 10^4 requests
# and never a segment the next batch or the active set holds.
RESIDENCY_WEIGHT = 1e4

QAS_VARIANTS: dict[str, dict[str, Any]] = {
    "paper": {},
    "canonical": {"canonical_ties": True},
    "residency": {"w_c": RESIDENCY_WEIGHT},
    "deadline": {"cold_deadline_ms": 2000.0},
    "canonical+deadline": {"canonical_ties": True, "cold_deadline_ms": 2000.0},
    "full": {"canonical_ties": True, "w_c": RESIDENCY_WEIGHT, "cold_deadline_ms": 2000.0},
}
DEFAULT_QAS_VARIANT = "full"


def qas_params(variant: str, overrides: dict[str, Any] | None = None) -> QasParams:
    """A variant's settings with explicit overrides on top (ValueError when unknown)."""
    try:
        preset = QAS_VARIANTS[variant]
    except KeyError:
        choices = ", ".join(QAS_VARIANTS)
        raise ValueError(f"unknown QAS variant {variant!r}; choose one of {choices}") from None
    return QasParams.from_overrides({**preset, **(overrides or {})})
