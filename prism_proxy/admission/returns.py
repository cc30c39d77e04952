"""When a paused agent session will be back: its return delay, learned online per
(agent type, tool) (sans-IO, pure apart from its own bounded tables).

A session pauses when its answer ends in a tool call and returns when the tool has
run. How long that takes depends on the tool far more than on anything else the proxy
sees: a record lookup is back in tens of milliseconds, a search in seconds, a hand-off
to a person in minutes. So the delays are kept per (head, tool), where the head is the
agent type (the session's shared prefix) and the tool is the sorted names of the tool
calls the answer made (parallel calls return together, when the slowest has run).

Each key's delays are modelled as lognormal: the mean and variance of their logarithms
over the last `window` delays. A key with fewer than `min_samples` delays falls back to
the head's delays over every tool, then to every head's, then to `prior_s`:

    predict(head, tool)           the median delay
    predict(head, tool, elapsed)  the median delay of those longer than `elapsed`
                                  (a tool that has run long is likely to run on)
    quantile(head, tool, q)       the q-quantile (a time-to-live that covers q of returns)

Bounded: `window` delays per key, `max_keys` keys (the least recently used dropped).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from statistics import NormalDist

ANY_TOOL = "*"
DELAY_WINDOW = 256  # delays kept per key
MAX_HEADS = 1024  # heads whose delays are kept
_NORMAL = NormalDist()
_MIN_DELAY_S = 1e-3  # delays are clamped to this before their logarithm
_MIN_SIGMA = 0.05
_MAX_TAIL = 1.0 - 1e-9  # the highest probability the conditional median solves for


def tool_key(names: Iterable[str]) -> str:
    """The tool part of a key: the answer's tool names, sorted, without repeats."""
    return "+".join(sorted(set(names))) or ANY_TOOL


class _LogWindow:
    """The last `size` log-delays of one key, with their running sums."""

    __slots__ = ("logs", "squares", "total")

    def __init__(self, size: int) -> None:
        self.logs: deque[float] = deque(maxlen=size)
        self.total = 0.0
        self.squares = 0.0

    def add(self, value: float) -> None:
        if len(self.logs) == self.logs.maxlen:
            old = self.logs[0]
            self.total -= old
            self.squares -= old * old
        self.logs.append(value)
        self.total += value
        self.squares += value * value

    def fit(self) -> tuple[float, float]:
        """(μ, σ) of the logs (σ at least `_MIN_SIGMA`)."""
        n = len(self.logs)
        mean = self.total / n
        variance = max(0.0, self.squares / n - mean * mean) * n / max(1, n - 1)
        return mean, max(_MIN_SIGMA, math.sqrt(variance))


@dataclass(frozen=True, slots=True)
class Fit:
    """A lognormal fit of one key's delays and where it came from (`level`: `tool`,
    `head`, `all` or `prior`)."""

    mu: float
    sigma: float
    samples: int
    level: str

    def median_s(self, elapsed_s: float = 0.0) -> float:
        """The median delay of those longer than `elapsed_s`."""
        if elapsed_s <= 0.0:
            return math.exp(self.mu)
        z = (math.log(max(elapsed_s, _MIN_DELAY_S)) - self.mu) / self.sigma
        survive = 1.0 - _NORMAL.cdf(z)
        target = min(_MAX_TAIL, 1.0 - survive / 2.0)
        return max(elapsed_s, math.exp(self.mu + self.sigma * _NORMAL.inv_cdf(target)))

    def quantile_s(self, q: float) -> float:
        return math.exp(self.mu + self.sigma * _NORMAL.inv_cdf(min(_MAX_TAIL, max(1e-9, q))))


class ReturnModel:
    """Return delays per (head, tool), learned as they are observed (module docstring)."""

    def __init__(
        self,
        *,
        window: int = DELAY_WINDOW,
        min_samples: int = 4,
        max_keys: int = 4096,
        prior_s: float = 10.0,
        prior_sigma: float = 1.0,
    ) -> None:
        if window < 2 or min_samples < 1 or max_keys < 3 or prior_s <= 0 or prior_sigma <= 0:
            raise ValueError("window >= 2, min_samples >= 1, max_keys >= 3, priors > 0")
        self.window = window
        self.min_samples = min_samples
        self.max_keys = max_keys
        self.prior = Fit(math.log(prior_s), prior_sigma, 0, "prior")
        self._windows: OrderedDict[tuple[str, str], _LogWindow] = OrderedDict()

    def observe(self, head: str, tool: str, delay_s: float) -> None:
        """A session of `head` paused on `tool` came back after `delay_s`."""
        value = math.log(max(delay_s, _MIN_DELAY_S))
        for key in ((head, tool), (head, ANY_TOOL), (ANY_TOOL, ANY_TOOL)):
            window = self._windows.get(key)
            if window is None:
                window = self._windows[key] = _LogWindow(self.window)
                while len(self._windows) > self.max_keys:
                    self._windows.popitem(last=False)
            else:
                self._windows.move_to_end(key)
            window.add(value)

    def fit(self, head: str, tool: str) -> Fit:
        """The most specific fit with `min_samples` delays."""
        levels = (((head, tool), "tool"), ((head, ANY_TOOL), "head"), ((ANY_TOOL, ANY_TOOL), "all"))
        for key, level in levels:
            window = self._windows.get(key)
            if window is not None and len(window.logs) >= self.min_samples:
                mu, sigma = window.fit()
                return Fit(mu, sigma, len(window.logs), level)
        return self.prior

    def predict(self, head: str, tool: str, elapsed_s: float = 0.0) -> float:
        """The median delay (of those longer than `elapsed_s`), seconds."""
        return self.fit(head, tool).median_s(elapsed_s)

    def quantile(self, head: str, tool: str, q: float) -> float:
        return self.fit(head, tool).quantile_s(q)

    @property
    def keys(self) -> int:
        return len(self._windows)

    def samples(self, tool: str) -> int:
        """Delays kept for `tool` over every head."""
        return sum(
            len(w.logs)
            for (head, name), w in self._windows.items()
            if name == tool and head != ANY_TOOL
        )


class HeadDelays:
    """The last `DELAY_WINDOW` return delays of each of the `MAX_HEADS` heads seen
    latest, as observed: the empirical quantile the session table's TTL takes."""

    def __init__(self) -> None:
        self._delays: OrderedDict[str, deque[float]] = OrderedDict()

    def observe(self, head: str, delay_s: float) -> None:
        delays = self._delays.pop(head, None)
        if delays is None:
            delays = deque(maxlen=DELAY_WINDOW)
        delays.append(delay_s)
        self._delays[head] = delays  # most recently seen last
        while len(self._delays) > MAX_HEADS:
            self._delays.popitem(last=False)

    def quantile(self, head: str, q: float, min_samples: int) -> float | None:
        """The `q` quantile of `head`'s delays (None with fewer than `min_samples`)."""
        delays = self._delays.get(head)
        if delays is None or len(delays) < min_samples:
            return None
        ordered = sorted(delays)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
