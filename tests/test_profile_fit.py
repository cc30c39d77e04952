"""The time-model fit of `bench.fit_cpu_profile` on synthetic timings with
known constants: it recovers them, and keeps the quadratic term only when it is there."""

from __future__ import annotations

import random

import pytest

from bench.profile_fit import fit_decode, fit_prefill, least_squares, profile_fields
from prism_sim.time_model import Profile

LENGTHS = (32, 128, 256, 512, 768, 1024, 1536, 2048, 3072)


def _noisy(value: float, rng: random.Random, sigma: float) -> float:
    return value * (1.0 + rng.gauss(0.0, sigma))


def test_least_squares_is_exact_on_a_line() -> None:
    fit = least_squares([(1.0, x) for x in (0, 1, 2, 3)], [1.0, 3.0, 5.0, 7.0])
    assert fit.coef == pytest.approx((1.0, 2.0))
    assert fit.rms_residual == pytest.approx(0.0, abs=1e-12)
    assert fit.stderr == pytest.approx((0.0, 0.0), abs=1e-9)


def test_prefill_recovers_a_quadratic_model() -> None:
    rng = random.Random(0)
    c0, rate, q = 0.05, 1000.0, 1.5e-7
    samples = [(n, _noisy(c0 + n / rate + q * n * n, rng, 0.01)) for n in LENGTHS for _ in range(3)]
    fit = fit_prefill(samples)
    assert fit.overhead_s == pytest.approx(c0, abs=0.01)
    assert fit.tokens_per_s == pytest.approx(rate, rel=0.05)
    assert fit.attention_s_per_token2 == pytest.approx(q, rel=0.15)
    assert fit.fit.rms_residual < fit.linear.rms_residual


def test_prefill_drops_a_quadratic_term_the_data_does_not_want() -> None:
    rng = random.Random(1)
    samples = [(n, _noisy(0.02 + n / 2000.0, rng, 0.01)) for n in LENGTHS for _ in range(3)]
    fit = fit_prefill(samples)
    assert fit.attention_s_per_token2 == 0.0
    assert fit.fit is fit.linear
    assert fit.tokens_per_s == pytest.approx(2000.0, rel=0.05)


def test_prefill_without_growth_is_refused() -> None:
    with pytest.raises(ValueError):
        fit_prefill([(n, 0.1) for n in (10, 20, 30)] + [(40, 0.09)])


def test_decode_recovers_overhead_and_per_request_cost() -> None:
    rng = random.Random(2)
    samples = [
        (n, _noisy(0.07 + 0.025 * n, rng, 0.02)) for n in (1, 2, 4, 8, 16, 24, 32) for _ in range(2)
    ]
    fit = fit_decode(samples)
    assert fit.overhead_s == pytest.approx(0.07, abs=0.02)
    assert fit.per_request_s == pytest.approx(0.025, rel=0.05)


def test_fitted_fields_make_a_valid_profile() -> None:
    prefill = fit_prefill([(n, 0.05 + n / 1000.0 + 1e-7 * n * n) for n in LENGTHS])
    decode = fit_decode([(n, 0.07 + 0.025 * n) for n in (1, 2, 4, 8)])
    fields = profile_fields(prefill, decode)
    profile = Profile(
        name="t", model_name="m", kv_capacity_tokens=1000, max_running_requests=8,
        chunked_prefill_size=4096, **fields,
    )  # fmt: skip
    assert profile.prefill_tokens_per_s == pytest.approx(1000.0, rel=1e-3)
    assert profile.decode_per_request_s == pytest.approx(0.025)
