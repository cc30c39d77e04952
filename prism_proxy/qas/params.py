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
    * `cache_view_tokens`: capacity of the baselines' approximate cache view (SPEC §5).
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

    def __post_init__(self) -> None:
        for name in ("f_front", "kappa", "q_cold", "cache_view_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")

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
            expected = int if isinstance(getattr(cls(), name), int) else float
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"params.{name}: expected a number, got {value!r}")
            if expected is int and float(value) != int(value):
                raise ValueError(f"params.{name}: expected an integer, got {value!r}")
            values[name] = expected(value)
        try:
            return cls(**values)
        except ValueError as exc:
            raise ValueError(f"params.{exc}") from None
