"""The knobs of the trace workloads (`rag_trace`, `agent_trace`, `reorder_trace`,
`session_trace`).

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


@dataclass(frozen=True)
class SessionParams:
    """Every knob of agent_sessions (`session_trace`)."""

    num_sessions: int = 200
    session_rate: float = 2.0
    min_calls: int = 6
    max_calls: int = 16
    tool_call_tokens: int = 48
    tool_median_s: float = 1.0
    tool_sigma: float = 1.2
    tool_scale: float = 1.0
    output_median_tokens: int = 600
    output_sigma: float = 0.8
    output_min_tokens: int = 100
    output_max_tokens: int = 4000
    task_alpha: float = 1.1
    final_answer_tokens: int = 64
    source: str = "auto"  # auto | tau2 | synthetic, as agent_prefix's material
    tau2_dir: str | None = None
    tool_model: str = "independent"  # independent | by_tool (module docstring)
    # what the sessions sweep's `--kv-fraction` is a fraction of: the unique live KV, or
    # the live histories counted per session (each with its own copy of the shared
    # prefix), the measure the runs before the accounting used
    pool_basis: str = "unique"  # unique | histories

    def __post_init__(self) -> None:
        if self.num_sessions < 1 or self.session_rate <= 0:
            raise ValueError("num_sessions >= 1 and session_rate > 0")
        if not 1 <= self.min_calls <= self.max_calls:
            raise ValueError("1 <= min_calls <= max_calls")
        if self.tool_median_s <= 0 or self.tool_sigma < 0 or self.tool_scale <= 0:
            raise ValueError("tool_median_s > 0, tool_sigma >= 0, tool_scale > 0")
        if not 0 < self.output_min_tokens <= self.output_max_tokens:
            raise ValueError("0 < output_min_tokens <= output_max_tokens")
        if self.tool_model not in ("independent", "by_tool"):
            raise ValueError("tool_model: independent or by_tool")
        if self.pool_basis not in ("unique", "histories"):
            raise ValueError("pool_basis: unique or histories")
