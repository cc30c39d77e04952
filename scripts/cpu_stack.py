"""The PRISM CPU stack end to end, without Docker (docs/deploy.md).

    python scripts/cpu_stack.py [--requests 40] [--qps 40] [--speed 4] [--out FILE]

Starts, on loopback and on free ports: the simulated engine (`prism-sim --eviction dart`
with its control RPC behind a bearer token), the proxy in front of it (`prism-proxy serve
--policy prism`, pushing priority tables to the control RPC), and a real Prometheus server
(Debian's `prometheus` binary, TSDB in a temporary directory) that scrapes the proxy's
`/metrics`, the engine's `/metrics` and the control RPC's `/prism/metrics` every second
from a generated configuration, the same jobs as `deploy/prometheus/prometheus.sim.yml`.
It replays a short zipf_hotspot trace through the proxy with `loadgen`, waits until
Prometheus has scraped the final counters, then asks Prometheus's HTTP API for the hit
rate and the P99 TTFT and prints them next to what the client measured, as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
PROMETHEUS_BIN = "prometheus"
SCRAPE_INTERVAL_S = 1

# Run-level queries (counters start at 0 with the fresh processes, so the raw ratio is the
# hit rate of the whole run; the dashboard shows the same ratio over a rate window).
HIT_RATE_PROXY = "sum(prism:cached_tokens_total) / sum(prism:prompt_tokens_total)"
HIT_RATE_ENGINE = "sum(sglang:cached_tokens_total) / sum(sglang:prompt_tokens_total)"
P99_TTFT = "histogram_quantile(0.99, sum by (le) (prism:ttft_seconds_bucket))"
PROMPT_TOKENS = "sum(prism:prompt_tokens_total)"
DART_EVICTED = "sum(prism:dart_evicted_tokens_total)"
ENGINE_EVICTED = "sum(sglang:evicted_tokens_total)"
ENGINE_PROMPT_TOKENS = "sum(sglang:prompt_tokens_total)"


@dataclass(frozen=True)
class Endpoints:
    """Where the stack's scrape targets listen (host:port, no scheme)."""

    proxy: str
    engine: str
    control: str


def prometheus_config(
    targets: Endpoints, token_file: Path, interval_s: int = SCRAPE_INTERVAL_S
) -> dict[str, Any]:
    """A Prometheus configuration with the jobs of deploy/prometheus/prometheus.sim.yml."""
    interval = f"{interval_s}s"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {"job_name": "prism-proxy", "static_configs": [{"targets": [targets.proxy]}]},
            {"job_name": "sglang", "static_configs": [{"targets": [targets.engine]}]},
            {
                "job_name": "prism-dart",
                "metrics_path": "/prism/metrics",
                "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
                "static_configs": [{"targets": [targets.control]}],
            },
        ],
    }


def find_prometheus() -> str | None:
    """Path of the Prometheus server binary (Debian package `prometheus`), if installed."""
    return shutil.which(PROMETHEUS_BIN)


@contextlib.contextmanager
def run_prometheus(
    config: Mapping[str, Any], workdir: Path, port: int, timeout_s: float = 60.0
) -> Iterator[str]:
    """Run a Prometheus server on 127.0.0.1:`port` until the block exits; yields its URL.

    The configuration is written as JSON (a subset of YAML) next to the TSDB in `workdir`.
    """
    binary = find_prometheus()
    if binary is None:
        raise FileNotFoundError("prometheus binary not found (make tools installs it)")
    config_path = workdir / "prometheus.yml"
    config_path.write_text(json.dumps(config, indent=1))
    log_path = workdir / "prometheus.log"
    url = f"http://127.0.0.1:{port}"
    command = [
        binary,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        from loadgen.stack.processes import wait_healthy

        try:
            wait_healthy(url, process, timeout_s, "/-/ready")
        except RuntimeError as exc:  # exited: say why
            raise RuntimeError(f"prometheus: {exc}: {log_path.read_text()[-2000:]}") from exc
        yield url
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=15)


def wait_targets_up(prometheus_url: str, jobs: int, timeout_s: float = 60.0) -> None:
    """Wait until Prometheus has discovered `jobs` targets and scraped each successfully
    (target discovery is applied a few seconds after start-up)."""
    deadline = time.monotonic() + timeout_s
    health: dict[str, str] = {}
    while time.monotonic() < deadline:
        data = httpx.get(prometheus_url + "/api/v1/targets", timeout=5.0).json()["data"]
        health = {t["labels"]["job"]: t["health"] for t in data["activeTargets"]}
        if len(health) == jobs and all(h == "up" for h in health.values()):
            return
        time.sleep(0.2)
    raise TimeoutError(f"Prometheus targets not all up after {timeout_s:.0f}s: {health}")


def query(prometheus_url: str, expr: str) -> dict[str, Any]:
    """`GET /api/v1/query` (instant query); returns the `data` object or raises."""
    response = httpx.get(prometheus_url + "/api/v1/query", params={"query": expr}, timeout=10.0)
    body = response.json()
    if response.status_code != 200 or body.get("status") != "success":
        raise ValueError(f"query {expr!r} failed: {body.get('error', response.status_code)}")
    return dict(body["data"])


def scalar(prometheus_url: str, expr: str) -> float | None:
    """The single value of an instant vector query, None if it returned no sample."""
    result = query(prometheus_url, expr)["result"]
    if not result:
        return None
    if len(result) != 1:
        raise ValueError(f"query {expr!r} returned {len(result)} series, expected 1")
    return float(result[0]["value"][1])


def wait_for_value(
    prometheus_url: str,
    expr: str,
    expected: float,
    *,
    at_least: bool = False,
    timeout_s: float = 60.0,
) -> float:
    """Poll `expr` until it equals `expected` (or reaches it, with `at_least`): Prometheus
    has scraped the counters' final values."""
    deadline = time.monotonic() + timeout_s
    value: float | None = None
    while time.monotonic() < deadline:
        value = scalar(prometheus_url, expr)
        if value is not None and (
            math.isclose(value, expected, rel_tol=1e-9) or (at_least and value > expected)
        ):
            return value
        time.sleep(0.25)
    raise TimeoutError(f"{expr} = {value}, expected {expected} after {timeout_s:.0f}s")


@dataclass(frozen=True)
class Stack:
    """The running CPU stack."""

    engine_url: str
    proxy_url: str
    control_url: str
    control_token: str
    prometheus_url: str | None
    workdir: Path


@contextlib.contextmanager
def cpu_stack(
    workdir: Path,
    *,
    speed: float = 4.0,
    kv_capacity_tokens: int | None = None,
    with_prometheus: bool = True,
) -> Iterator[Stack]:
    """Start prism-sim (DART + control RPC), the proxy and (optionally) Prometheus.

    A small `kv_capacity_tokens` makes the engine evict, so DART's eviction metrics move.
    """
    from loadgen.stack.processes import engine_args, free_port, proxy_args, run_server

    token = secrets.token_hex(16)
    control_port = free_port()
    logs = workdir / "logs"
    sim_args = engine_args({"eviction": "dart", "speed": speed, "control_port": control_port,
                            "kv_capacity_tokens": kv_capacity_tokens})  # fmt: skip
    secret = {"PRISM_CONTROL_TOKEN": token}  # in the environment: never on a command line
    with run_server("prism_sim", sim_args, log_dir=logs, name="prism-sim", env=secret) as engine:
        control_url = f"http://127.0.0.1:{control_port}"
        serve = proxy_args({"backend": engine.url, "policy": "prism", "control_url": control_url})
        with run_server(
            "prism_proxy", serve, log_dir=logs, name="prism-proxy", env=secret
        ) as proxy:
            if not with_prometheus:
                yield Stack(engine.url, proxy.url, control_url, token, None, workdir)
                return
            token_file = workdir / "control-token"
            token_file.write_text(token)
            token_file.chmod(0o600)
            hostport = Endpoints(
                proxy=proxy.url.removeprefix("http://"),
                engine=engine.url.removeprefix("http://"),
                control=control_url.removeprefix("http://"),
            )
            config = prometheus_config(hostport, token_file)
            with run_prometheus(config, workdir, free_port()) as prometheus_url:
                wait_targets_up(prometheus_url, len(config["scrape_configs"]))
                yield Stack(engine.url, proxy.url, control_url, token, prometheus_url, workdir)


def replay_trace(
    proxy_url: str, *, requests: int, qps: float, speed: float, seed: int = 0
) -> dict[str, Any]:
    """Replay a short zipf_hotspot trace (SPEC §6) through the proxy; loadgen's results."""
    from loadgen.clients.replay import ReplayConfig, replay
    from loadgen.workloads.rag_trace import RagTraceParams, build_rag_trace
    from loadgen.workloads.trace_format import Trace
    from prism_tokens.tokenizer import load_tokenizer

    params = RagTraceParams(passages=200, num_requests=requests, qps=qps, max_tokens=8)
    header, trace_requests = build_rag_trace(params, seed, load_tokenizer("builtin"), "builtin")
    trace = Trace(header=header, requests=tuple(trace_requests))
    config = ReplayConfig(target=proxy_url, api="prism", time_scale=speed, progress=False)
    return asyncio.run(replay(trace, config))


def _source_total(url: str, sample: str, headers: Mapping[str, str] | None = None) -> float:
    """Sum of one sample name's values in a Prometheus text page, read at the source."""
    from loadgen.experiments.sweep import metric_totals

    response = httpx.get(url, headers=dict(headers or {}), timeout=10.0)
    response.raise_for_status()
    return metric_totals(response.text).get(sample, 0.0)


def measure(stack: Stack, results: Mapping[str, Any]) -> dict[str, Any]:
    """Wait for Prometheus to hold the client's final counters, then read the numbers."""
    assert stack.prometheus_url is not None
    done = [r for r in results["requests"] if r["success"]]
    prompt = sum(r["prompt_tokens"] or 0 for r in done)
    cached = sum(r["cached_tokens"] or 0 for r in done)
    # The engine's and DART's counters hold at least the replay once it is over: read
    # them at the source, then wait until Prometheus has scraped that much.
    auth = {"Authorization": f"Bearer {stack.control_token}"}
    engine_prompt = _source_total(stack.engine_url + "/metrics", "sglang:prompt_tokens_total")
    dart_evicted = _source_total(
        stack.control_url + "/prism/metrics", "prism:dart_evicted_tokens_total", auth
    )
    wait_for_value(stack.prometheus_url, PROMPT_TOKENS, float(prompt))
    wait_for_value(stack.prometheus_url, ENGINE_PROMPT_TOKENS, engine_prompt, at_least=True)
    wait_for_value(stack.prometheus_url, DART_EVICTED, dart_evicted, at_least=True)
    return {
        "requests": len(results["requests"]),
        "completed": len(done),
        "client_prompt_tokens": prompt,
        "client_cached_tokens": cached,
        "client_hit_rate": cached / prompt if prompt else None,
        "client_p99_ttft_ms": results["summary"].get("p99_ttft_ms"),
        "prometheus_hit_rate_proxy": scalar(stack.prometheus_url, HIT_RATE_PROXY),
        "prometheus_hit_rate_engine": scalar(stack.prometheus_url, HIT_RATE_ENGINE),
        "prometheus_p99_ttft_s": scalar(stack.prometheus_url, P99_TTFT),
        "prometheus_dart_evicted_tokens": scalar(stack.prometheus_url, DART_EVICTED),
        "prometheus_engine_evicted_tokens": scalar(stack.prometheus_url, ENGINE_EVICTED),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=40, help="trace length")
    parser.add_argument("--qps", type=float, default=40.0, help="offered load (modeled)")
    parser.add_argument("--speed", type=float, default=4.0, help="prism-sim time scale")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--kv-capacity-tokens", type=int, default=None, help="prism-sim KV capacity (evictions)"
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, TSDB)")
    args = parser.parse_args(argv)
    if find_prometheus() is None:
        print("cpu_stack: the prometheus binary is missing (run `make tools`)", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="prism-cpu-stack-"))
    try:
        with cpu_stack(
            workdir, speed=args.speed, kv_capacity_tokens=args.kv_capacity_tokens
        ) as stack:
            results = replay_trace(
                stack.proxy_url, requests=args.requests, qps=args.qps, speed=args.speed,
                seed=args.seed,
            )  # fmt: skip
            report = {"prometheus": stack.prometheus_url, **measure(stack, results)}
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if args.keep:
        print(f"work dir kept: {workdir}", file=sys.stderr)
    return 0 if report["completed"] == report["requests"] else 1


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
