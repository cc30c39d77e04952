"""agent_sessions on the real stack (`prism-loadgen sessions --real`): prism-sim over
HTTP, the proxy as a subprocess where the line has one, and the closed-loop replay with
the real `openai` client (`session_replay`).

The engine's clock runs `speed` times faster and the replay divides arrivals and tool
durations by the same factor; records come back in the trace's seconds. The proxy's
QAS window is divided by `speed` too, so it stays 10 ms of modeled time; its learned
session TTLs are in wall seconds, as is the engine's (DART's) clock, so they agree.

Lines (a subset of the twin's `session_sweep.LINES`, same settings):

    sglang-lru        prism-sim alone, fcfs, LRU
    prism             proxy (QAS full) + prism-sim with DART and its control RPC
    prism+sessions    the same with `--set sessions=true`
    prism+sessions+returns
                      and `--set session_rank=predicted`
    prism+sessions+returns+backlog
                      and the backlog rule (`backlog_ms`, `age_cap_ms`: the twin's
                      modeled milliseconds divided by `speed`)
    continuum-style   proxy `--policy continuum-style --set sessions=true
                      --set session_rank=program` + DART
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loadgen.clients.session_replay import SessionReplayConfig, replay_sessions
from loadgen.stack.processes import engine_args, free_port, proxy_args, run_server
from loadgen.twin.session_twin import shared_tokens
from loadgen.workloads.session_trace import SessionTrace, belady_bound
from prism_tokens.tokenizer import Tokenizer

REAL_LINES = (
    "sglang-lru",
    "prism",
    "prism+sessions",
    "prism+sessions+returns",
    "prism+sessions+returns+backlog",
    "continuum-style",
)
# The backlog line's thresholds in the twin's modeled time (session_sweep's `_lines`).
BACKLOG_MS, AGE_CAP_MS = 1000.0, 8000.0
WINDOW_MS = 10.0


@contextlib.contextmanager
def _stack(line: str, pool: int, speed: float, log_dir: Path) -> Iterator[str]:
    """The servers of `line`; yields the URL the client talks to."""
    token = secrets.token_hex(8)
    control_port = free_port()
    sim: dict[str, Any] = {"kv_capacity_tokens": pool, "speed": speed, "log_level": "warning"}
    if line == "sglang-lru":
        with run_server("prism_sim", engine_args(sim), log_dir=log_dir, name="sim") as engine:
            yield engine.url
        return
    sim |= {"eviction": "dart", "control_port": control_port}
    settings: dict[str, Any] = {"control_url": f"http://127.0.0.1:{control_port}"}
    settings |= {"window_ms": WINDOW_MS / speed, "log_level": "warning"}
    secret = {"PRISM_CONTROL_TOKEN": token}  # in the environment: never on a command line
    if line == "prism":
        settings |= {"policy": "prism", "qas": "full", "sessions": False}
    elif line == "prism+sessions":
        settings |= {"policy": "prism", "qas": "full", "sessions": True}
    elif line in ("prism+sessions+returns", "prism+sessions+returns+backlog"):
        settings |= {"policy": "prism", "qas": "full", "sessions": True}
        settings |= {"session_rank": "predicted"}
        if line.endswith("+backlog"):  # the proxy's clock is the wall's: modeled / speed
            settings |= {"backlog_ms": BACKLOG_MS / speed, "age_cap_ms": AGE_CAP_MS / speed}
    elif line == "continuum-style":
        settings |= {"policy": "continuum-style", "sessions": True, "session_rank": "program"}
    else:
        raise ValueError(f"unknown real-stack line {line!r}; choose from {REAL_LINES}")
    with run_server(
        "prism_sim", engine_args(sim), log_dir=log_dir, name="sim", env=secret
    ) as engine:
        args = proxy_args({**settings, "backend": engine.url})
        with run_server("prism_proxy", args, log_dir=log_dir, name="proxy", env=secret) as proxy:
            yield proxy.url


def run_real_line(
    line: str, trace: SessionTrace, pool: int, speed: float, tokenizer: Tokenizer, log_dir: Path
) -> dict[str, Any]:
    shared = shared_tokens(trace, tokenizer)
    started = time.monotonic()
    with _stack(line, pool, speed, log_dir / line) as url:
        config = SessionReplayConfig(target=url, time_scale=speed, shared_tokens=shared)
        results = asyncio.run(replay_sessions(trace, config))
    calls = [
        (c["sid"], c["sent"] + c["ttft_s"], c["end"], c["prompt_tokens"])
        for r in results["sessions"]
        for c in r["calls"]
        if c["prompt_tokens"] is not None and c["ttft_s"] is not None
    ]
    bound = belady_bound(trace, calls, shared, pool)
    return {
        "line": line,
        "engine": "real",
        "speed": speed,
        "summary": results["summary"],
        "belady_hit_rate": bound.hit_rate,
        "belady_non_global_hit_rate": bound.non_global_hit_rate,
        "wall_s": time.monotonic() - started,
    }
