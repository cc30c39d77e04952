"""Seeded random draws shared by the trace generators (SPEC §6): pure functions.

Each concern draws from its own stream (``stream(seed, name)``), so that changing the
QPS changes only the arrival times and leaves every prompt identical: the paper
separates offered-load variation from segment popularity the same way.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np


def stream(seed: int, name: str) -> np.random.Generator:
    """An independent generator for one concern (``"arrivals"``, ``"content"``, …)."""
    return np.random.default_rng([int(seed), zlib.crc32(name.encode())])


def poisson_arrivals(rng: np.random.Generator, num_requests: int, qps: float) -> list[float]:
    """Arrival times of a Poisson process at ``qps``: exponential gaps of mean 1/qps.

    The first request arrives at 0; the trace spans ``num_requests - 1`` gaps.
    """
    if num_requests <= 0:
        return []
    if qps <= 0:
        raise ValueError("qps must be positive")
    gaps = rng.exponential(1.0 / qps, size=num_requests - 1)
    return [0.0, *np.cumsum(gaps).tolist()]


def zipf_weights(num_ranks: int, alpha: float) -> np.ndarray:
    """Probability of rank i (1-based) ∝ i^-alpha, over ``num_ranks`` ranks."""
    ranks = np.arange(1, num_ranks + 1, dtype=float)
    weights = ranks ** (-float(alpha))
    return weights / weights.sum()


def draw_without_repeats(rng: np.random.Generator, weights: np.ndarray, count: int) -> list[int]:
    """``count`` distinct indices, each drawn by ``weights`` renormalised over the rest."""
    remaining = np.array(weights, dtype=float)
    chosen: list[int] = []
    for _ in range(count):
        probabilities = remaining / remaining.sum()
        index = int(rng.choice(len(remaining), p=probabilities))
        chosen.append(index)
        remaining[index] = 0.0
    return chosen


def sample_distinct(rng: np.random.Generator, population: Sequence[int], count: int) -> list[int]:
    """``count`` distinct members of ``population``, uniformly."""
    picks = rng.choice(len(population), size=count, replace=False)
    return [population[int(i)] for i in picks]
