"""Answer-quality scores (SPEC §6) and their noise: pure functions.

SQuAD-style: lowercase, drop punctuation and the articles a/an/the, collapse spaces;
token F1 and exact match, each the maximum over the reference answers, and whether
the answer contains a reference (for models that answer in sentences). The noise of a
mean over questions is a percentile bootstrap over questions (seeded); two orders of
the same questions are compared *paired*: the interval of the mean per-question
difference, which is what "within noise" has to mean when both orders answer the same
questions.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lowercase, no punctuation, no articles, single spaces."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, reference: str) -> float:
    """Token-overlap F1 of two answers after normalisation (1.0 when both are empty)."""
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not predicted or not expected:
        return float(predicted == expected)
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, reference: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(reference))


def contains_answer(prediction: str, reference: str) -> float:
    """1.0 when the normalised reference occurs, as whole words, in the normalised
    prediction: the lenient score for a model that answers in sentences."""
    expected = normalize_answer(reference)
    return float(bool(expected) and f" {expected} " in f" {normalize_answer(prediction)} ")


def best_scores(prediction: str, references: Sequence[str]) -> tuple[float, float, float]:
    """(F1, EM, contains), each the maximum over `references`."""
    if not references:
        raise ValueError("a question needs at least one reference answer")
    return (
        max(token_f1(prediction, r) for r in references),
        max(exact_match(prediction, r) for r in references),
        max(contains_answer(prediction, r) for r in references),
    )


@dataclass(frozen=True)
class Interval:
    """A mean and its 95 % bootstrap interval."""

    mean: float
    low: float
    high: float

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def __str__(self) -> str:
        return f"{self.mean:.3f} [{self.low:.3f}, {self.high:.3f}]"


def bootstrap_mean(
    values: Sequence[float], *, resamples: int = 10_000, seed: int = 0, level: float = 0.95
) -> Interval:
    """The mean of `values` with a percentile bootstrap interval (resampling values)."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("no values")
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(resamples, data.size))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return Interval(float(data.mean()), float(low), float(high))


def paired_difference(
    treated: Sequence[float], control: Sequence[float], *, resamples: int = 10_000, seed: int = 0
) -> Interval:
    """Mean of `treated[i] - control[i]` over the same questions, with its interval."""
    if len(treated) != len(control):
        raise ValueError("paired scores must cover the same questions")
    diffs = np.asarray(treated, dtype=float) - np.asarray(control, dtype=float)
    return bootstrap_mean(diffs.tolist(), resamples=resamples, seed=seed)
