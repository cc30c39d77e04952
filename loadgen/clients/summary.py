"""Per-request records and the run summary, with SGLang bench_serving's key names.

Times inside are modeled seconds/milliseconds: the replay already multiplied wall
times by the time scale. The hit rate is Σ cached_tokens / Σ prompt_tokens over the
completed requests that reported both (the realized exact-prefix hit rate, SPEC §4).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class RequestRecord:
    """What the replay measured for one request."""

    rid: str
    arrival_s: float
    send_lag_ms: float
    success: bool
    ttft_ms: float | None
    e2e_latency_ms: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    hot: bool
    lane: str | None = None
    status: int | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _percentiles(prefix: str, values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {
            f"mean_{prefix}_ms": None,
            f"median_{prefix}_ms": None,
            f"std_{prefix}_ms": None,
            **{f"p{p}_{prefix}_ms": None for p in (90, 95, 99)},
        }
    array = np.asarray(values, dtype=float)
    return {
        f"mean_{prefix}_ms": float(array.mean()),
        f"median_{prefix}_ms": float(np.median(array)),
        f"std_{prefix}_ms": float(array.std()),
        **{f"p{p}_{prefix}_ms": float(np.percentile(array, p)) for p in (90, 95, 99)},
    }


def _hit_rate(records: Sequence[RequestRecord]) -> tuple[int, int, float | None]:
    counted = [r for r in records if r.prompt_tokens and r.cached_tokens is not None]
    prompt = sum(r.prompt_tokens or 0 for r in counted)
    cached = sum(r.cached_tokens or 0 for r in counted)
    return prompt, cached, (cached / prompt if prompt else None)


def _group(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Completed count, hit rate, token totals and TTFT percentiles of ``records``."""
    done = [r for r in records if r.success]
    prompt, cached, hit_rate = _hit_rate(done)
    ttfts = [r.ttft_ms for r in done if r.ttft_ms is not None]
    return {
        "completed": len(done),
        "hit_rate": hit_rate,
        "total_input_tokens": prompt,
        "total_cached_tokens": cached,
        **_percentiles("ttft", ttfts),
    }


def summarize(
    records: Sequence[RequestRecord], duration_s: float, request_rate: float | None
) -> dict[str, Any]:
    """The run summary (bench_serving names where they exist)."""
    overall = _group(records)
    done = [r for r in records if r.success]
    failed = [r for r in records if not r.success]
    output_tokens = sum(r.completion_tokens or 0 for r in done)
    e2e = [r.e2e_latency_ms for r in done if r.e2e_latency_ms is not None]
    lags = [r.send_lag_ms for r in records]
    lanes = sorted({r.lane for r in records if r.lane})
    duration = max(duration_s, 1e-9)
    return {
        "request_rate": request_rate,
        "num_requests": len(records),
        **overall,
        "failed": len(failed),
        "errors": dict(Counter(r.error or "unknown" for r in failed).most_common(10)),
        "duration": duration_s,
        "request_throughput": len(done) / duration,
        "input_throughput": overall["total_input_tokens"] / duration,
        "output_throughput": output_tokens / duration,
        "total_output_tokens": output_tokens,
        "concurrency": sum(e2e) / 1000.0 / duration,
        **_percentiles("e2e_latency", e2e),
        "hot": _group([r for r in records if r.hot]),
        "cold": _group([r for r in records if not r.hot]),
        "lanes": {lane: _group([r for r in records if r.lane == lane]) for lane in lanes},
        "max_send_lag_ms": max(lags) if lags else None,
        "p99_send_lag_ms": float(np.percentile(lags, 99)) if lags else None,
    }
