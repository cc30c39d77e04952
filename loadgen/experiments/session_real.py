"""agent_sessions on the real stack (`prism-loadgen sessions --real`): prism-sim over
HTTP, the proxy as a subprocess where the line has one, and the closed-loop replay with
the real `openai` client (`session_replay`).

The engine's clock runs `speed` times faster and the replay divides arrivals and tool
durations by the same factor; records come back in the trace's seconds. The proxy's
QAS window is divided by `speed` too, so it stays 10 ms of modeled time; its learned
session TTLs are in wall seconds, as is the engine's (DART's) clock, so they agree.

Lines: `session_lines.REAL_LINES`, the twin's lines of the same names. The engine's and
the proxy's settings come from the line (`loadgen.stack.lines`): its QAS times (the
backlog line's `backlog_ms`, `age_cap_ms`) are the twin's modeled milliseconds, divided
by `speed` here as the window is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loadgen.clients.session_replay import SessionReplayConfig, replay_sessions
from loadgen.experiments.sweep import git_commit
from loadgen.stack.lines import Line, line_engine_settings, line_proxy_settings
from loadgen.stack.processes import engine_args, free_port, proxy_args, run_server
from loadgen.twin.session_twin import shared_tokens
from loadgen.workloads.session_trace import SessionTrace, belady_bound
from prism_tokens.tokenizer import Tokenizer

WINDOW_MS = 10.0


def stack_settings(
    line: Line, pool: int, speed: float, control_port: int | None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """prism-sim's settings and the proxy's (None: the line has no proxy; its backend,
    the engine's URL, is added once the engine runs) for `line` with a pool of `pool`
    tokens at clock `speed`, DART's control RPC on `control_port` where the line uses it."""
    sim: dict[str, Any] = {"kv_capacity_tokens": pool, "speed": speed, "log_level": "warning"}
    sim |= line_engine_settings(line, at_defaults=False)
    if line.policy is None:
        return sim, None
    proxy: dict[str, Any] = {}
    if line.control_rpc:
        sim["control_port"] = control_port
        proxy["control_url"] = f"http://127.0.0.1:{control_port}"
    proxy |= {"window_ms": WINDOW_MS / speed, "log_level": "warning"}
    return sim, proxy | line_proxy_settings(line, speed=speed)


@contextlib.contextmanager
def _stack(
    line: Line, pool: int, speed: float, log_dir: Path, request_log: Path | None = None
) -> Iterator[str]:
    """The servers of `line`; yields the URL the client talks to. `request_log`: where
    prism-sim writes each finished request's timeline (`PRISM_SIM_REQUEST_LOG`)."""
    token = secrets.token_hex(8)
    control_port = free_port() if line.control_rpc else None
    sim, proxy = stack_settings(line, pool, speed, control_port)
    logged = {"PRISM_SIM_REQUEST_LOG": str(request_log)} if request_log is not None else {}
    if proxy is None:
        with run_server(
            "prism_sim", engine_args(sim), log_dir=log_dir, name="sim", env=logged
        ) as engine:
            yield engine.url
        return
    secret = {"PRISM_CONTROL_TOKEN": token}  # in the environment: never on a command line
    with run_server(
        "prism_sim", engine_args(sim), log_dir=log_dir, name="sim", env=secret | logged
    ) as engine:
        args = proxy_args({**proxy, "backend": engine.url})
        with run_server("prism_proxy", args, log_dir=log_dir, name="proxy", env=secret) as server:
            yield server.url


def run_real_line(
    line: Line,
    trace: SessionTrace,
    pool: int,
    speed: float,
    tokenizer: Tokenizer,
    log_dir: Path,
    save_calls: bool = False,
) -> dict[str, Any]:
    """`line` on the real stack with a pool of `pool` tokens: its summary and Belady's
    bound on its own calls; with `save_calls`, its per-call records (`calls`: the
    client's sessions, `engine_records`: prism-sim's timeline of each request)."""
    shared = shared_tokens(trace, tokenizer)
    started = time.monotonic()
    line_logs = log_dir / line.label
    request_log = line_logs / "engine-requests.jsonl" if save_calls else None
    if request_log is not None:
        line_logs.mkdir(parents=True, exist_ok=True)
        request_log.unlink(missing_ok=True)
    with _stack(line, pool, speed, line_logs, request_log) as url:
        config = SessionReplayConfig(
            target=url, time_scale=speed, shared_tokens=shared, send_rid=save_calls
        )
        results = asyncio.run(replay_sessions(trace, config))
    calls = [
        (c["sid"], c["sent"] + c["ttft_s"], c["end"], c["prompt_tokens"])
        for r in results["sessions"]
        for c in r["calls"]
        if c["prompt_tokens"] is not None and c["ttft_s"] is not None
    ]
    bound = belady_bound(trace, calls, shared, pool)
    saved: dict[str, Any] = {}
    if request_log is not None:
        engine_records = [json.loads(x) for x in request_log.read_text().splitlines() if x]
        saved = {"calls": results["sessions"], "engine_records": engine_records}
    return {
        "line": line.label,
        "engine": "real",
        "speed": speed,
        "summary": results["summary"],
        "belady_hit_rate": bound.hit_rate,
        "belady_non_global_hit_rate": bound.non_global_hit_rate,
        "wall_s": time.monotonic() - started,
        "git_commit": git_commit(),
        **saved,
    }
