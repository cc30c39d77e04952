"""Least-squares fit of the time model's constants from measured timings.

Pure functions, no server: `bench.fit_cpu_profile` measures, this fits. The forms are
the simulated engine's (SPEC §7, `prism_sim.time_model`):

    prefill batch time = c0 + uncached / R_pf + q · Σ extend·seq
    decode step time   = d0 + d1 · running

Prefill samples are single requests with nothing cached, so extend = seq = L and the
quadratic term is q · L². It is kept only when the data wants it: the fitted q must be
positive, more than two standard errors from zero, and worth at least 5 % of the
predicted time at the longest prompt measured; otherwise the linear fit stands.
Both fits minimize relative errors (each sample weighted by 1/t): timing noise here is
roughly proportional to the time, and short batches matter as much as long ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIN_QUADRATIC_SHARE = 0.05  # q·L² must be this share of the time at the longest L


@dataclass(frozen=True)
class LinearFit:
    """Ordinary least squares y ≈ X·coef: coefficients, their standard errors, residuals."""

    coef: tuple[float, ...]
    stderr: tuple[float, ...]
    residuals: tuple[float, ...]

    @property
    def rms_residual(self) -> float:
        return float(np.sqrt(np.mean(np.square(self.residuals)))) if self.residuals else 0.0


def least_squares(
    rows: Sequence[Sequence[float]], y: Sequence[float], relative: bool = False
) -> LinearFit:
    """Least squares of `y` on the columns of `rows` (with `relative`, of the errors
    relative to y); standard errors from σ²(XᵀX)⁻¹ of the weighted system (zero when
    there are no spare degrees of freedom); residuals in y's units."""
    x = np.asarray(rows, dtype=float)
    target = np.asarray(y, dtype=float)
    if x.ndim != 2 or x.shape[0] != target.shape[0] or x.shape[0] < x.shape[1]:
        raise ValueError("need at least as many samples as coefficients")
    if relative and np.any(target <= 0):
        raise ValueError("relative least squares needs positive y")
    weight = 1.0 / target if relative else np.ones_like(target)
    xw, yw = x * weight[:, None], target * weight
    coef, *_ = np.linalg.lstsq(xw, yw, rcond=None)
    residuals = target - x @ coef
    dof = x.shape[0] - x.shape[1]
    if dof > 0:
        weighted = yw - xw @ coef
        sigma2 = float(weighted @ weighted) / dof
        cov = sigma2 * np.linalg.pinv(xw.T @ xw)
        stderr = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    else:
        stderr = np.zeros(x.shape[1])
    return LinearFit(
        tuple(float(c) for c in coef),
        tuple(float(s) for s in stderr),
        tuple(float(r) for r in residuals),
    )


@dataclass(frozen=True)
class PrefillFit:
    overhead_s: float
    tokens_per_s: float
    attention_s_per_token2: float
    fit: LinearFit
    linear: LinearFit  # the fit without q, for the record


@dataclass(frozen=True)
class DecodeFit:
    overhead_s: float
    per_request_s: float
    fit: LinearFit


def fit_prefill(samples: Sequence[tuple[int, float]]) -> PrefillFit:
    """c0, R_pf and q from (uncached prompt length L, seconds) of single requests."""
    lengths = [float(n) for n, _ in samples]
    times = [t for _, t in samples]
    linear = least_squares([(1.0, n) for n in lengths], times, relative=True)
    quadratic = least_squares([(1.0, n, n * n) for n in lengths], times, relative=True)
    q, q_err = quadratic.coef[2], quadratic.stderr[2]
    longest = max(lengths)
    share = q * longest**2 / (quadratic.coef[0] + quadratic.coef[1] * longest + q * longest**2)
    wanted = q > 2 * q_err and share >= MIN_QUADRATIC_SHARE and quadratic.coef[1] > 0
    chosen = quadratic if wanted else linear
    if chosen.coef[1] <= 0:
        raise ValueError("prefill time does not grow with the prompt: cannot fit a rate")
    return PrefillFit(
        overhead_s=max(chosen.coef[0], 0.0),
        tokens_per_s=1.0 / chosen.coef[1],
        attention_s_per_token2=chosen.coef[2] if chosen is quadratic else 0.0,
        fit=chosen,
        linear=linear,
    )


def fit_decode(samples: Sequence[tuple[int, float]]) -> DecodeFit:
    """d0 and d1 from (running requests, seconds per decode step); negatives clip to 0."""
    fit = least_squares(
        [(1.0, float(n)) for n, _ in samples], [t for _, t in samples], relative=True
    )
    return DecodeFit(max(fit.coef[0], 0.0), max(fit.coef[1], 0.0), fit)


def profile_fields(prefill: PrefillFit, decode: DecodeFit) -> dict[str, float]:
    """The time-model fields of a profile JSON (`prism_sim.time_model.Profile`),
    rounded to what the data can carry."""
    return {
        "prefill_overhead_s": round(prefill.overhead_s, 4),
        "prefill_tokens_per_s": round(prefill.tokens_per_s, 1),
        "prefill_attention_s_per_token2": float(f"{prefill.attention_s_per_token2:.3g}"),
        "decode_overhead_s": round(decode.overhead_s, 4),
        "decode_per_request_s": round(decode.per_request_s, 5),
    }
