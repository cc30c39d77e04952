"""The knobs of the trace workloads (`rag_trace`, `agent_trace`, `reorder_trace`).

Plain dataclasses importing nothing heavy: `prism-loadgen`'s argument parser makes its
flags from them, so `prism-loadgen --help` runs without the `loadgen` extra (numpy).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RagTraceParams:
    """Every knob of zipf_hotspot; defaults are SPEC §6's."""

    passages: int = 981
    hot_set: int = 20
    r_hot: float = 0.7
    hot_count: int = 4
    alpha: float = 1.2
    k: int = 5
    chunk_tokens: int = 128
    num_requests: int = 2048
    qps: float = 50.0
    system_tokens: int = 64
    question_tokens: int = 40
    max_tokens: int = 32
    corpus: str | None = None

    @property
    def max_hot(self) -> int:
        """The most hot passages one request holds."""
        return self.k if self.hot_count == -1 else self.hot_count

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError("k must be at least 1")
        if not 0.0 <= self.r_hot <= 1.0:
            raise ValueError("r_hot is a probability")
        if self.hot_count != -1 and not 1 <= self.hot_count <= self.k:
            raise ValueError("hot_count must be in 1…k, or -1 (uniform in 1…k)")
        if self.hot_set < self.max_hot:
            raise ValueError("hot_set too small for the hot passages a request draws")
        if self.corpus is None and self.passages - self.hot_set < self.k:
            raise ValueError("need at least k cold passages (passages - hot_set >= k)")
        if self.num_requests < 0 or self.qps <= 0:
            raise ValueError("num_requests >= 0 and qps > 0")


@dataclass(frozen=True)
class AgentTraceParams:
    num_requests: int = 2048
    qps: float = 40.0
    max_tokens: int = 32
    concurrency: int = 32
    max_calls: int = 8
    system_tokens: int = 48
    source: str = "auto"  # auto | tau2 | synthetic
    tau2_dir: str | None = None

    def __post_init__(self) -> None:
        if self.source not in ("auto", "tau2", "synthetic"):
            raise ValueError("source must be auto, tau2 or synthetic")
        if self.concurrency < 1 or self.max_calls < 1 or self.qps <= 0:
            raise ValueError("concurrency >= 1, max_calls >= 1, qps > 0")


@dataclass(frozen=True)
class ReorderTraceParams:
    """Every knob of reorder_replay."""

    passages: int = 981
    k: int = 5
    r_repeat: float = 0.5
    chunk_tokens: int = 128
    num_requests: int = 400
    qps: float = 2.0
    system_tokens: int = 64
    question_tokens: int = 40
    max_tokens: int = 32

    def __post_init__(self) -> None:
        if not 1 <= self.k <= self.passages:
            raise ValueError("k must be in 1…passages")
        if not 0.0 <= self.r_repeat <= 1.0:
            raise ValueError("r_repeat is a probability")
        if self.num_requests < 0 or self.qps <= 0:
            raise ValueError("num_requests >= 0 and qps > 0")
