"""The paper's comparison: every line × every QPS, each on a fresh engine.

Two engines run the same sweep and write the same results and report:

* ``sweep`` — the real stack in real time: for each point a fresh simulated engine
  (``python -m prism_sim``, empty cache, the line's eviction and schedule policy; the
  control RPC for ``prism``), a fresh proxy (``python -m prism_proxy serve --policy …``)
  unless the line is native SGLang, and one open-loop replay (``--api prism``
  through the proxy, ``--api native`` straight to the engine), then both are torn down.
* ``simulate`` — the twin (``loadgen.twin.twin``): the same admission core, policies,
  serializer, scheduler, radix cache and DART in one deterministic modeled-time run.

Results land in ``<out>/results/<label>_qps<λ>.json``; the report (table + plots) in
``<out>``. Each result records the settings its line ran with: the proxy's
own account of them (``variant.proxy_settings``, from its ``/server_info``) or the
twin's ``TwinSetup`` (``variant.twin_setup``); ``sweep.json`` lists them per line too.

Seeds. ``--seed 0,1,2`` runs the whole sweep once per seed, each on its own traces;
results are then ``<label>_qps<λ>_seed<k>.json`` and the report gives means over seeds
with 95 % intervals (``loadgen.reports.report``). One seed (``--seed N``) keeps the names above.

Speed. ``--speed F`` runs the engine's clock F× faster and replays with time scale F
(results stay in modeled seconds); the proxy's QAS window is scaled by 1/F too, so it
stays 10 ms of modeled time. The twin has no wall clock: ``--speed`` does not apply.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from loadgen.clients.apis import CHAT_LAYOUTS
from loadgen.stack.cpu_models import CPU_MODELS
from loadgen.stack.lines import (
    ALL_POLICIES,
    LINE_KEYS,
    Line,
    line_engine_settings,
    line_proxy_settings,
    line_qas,
    spec_lines,
)
from loadgen.stack.processes import (
    engine_args,
    free_port,
    parse_settings,
    proxy_args,
    run_server,
)
from prism_proxy.qas.params import DEFAULT_QAS_VARIANT, QAS_VARIANTS

DEFAULT_QPS = (40.0, 50.0, 60.0, 70.0, 80.0)
ENGINES = ("sim", "twin")


@dataclass(frozen=True)
class SweepConfig:
    out: Path
    lines: tuple[Line, ...]
    qps: tuple[float, ...] = DEFAULT_QPS
    workload: str = "rag"
    num_requests: int = 2048
    seed: int = 0
    speed: float = 1.0
    profile: str = "a800-qwen3-4b"
    tokenizer: str = "builtin"
    corpus: str | None = None
    window_ms: float = 10.0
    tau2_dir: str | None = None
    sim_args: tuple[str, ...] = ()
    proxy_args: tuple[str, ...] = ()
    engine: str = "sim"  # "sim": the real stack in real time; "twin": modeled time
    backend: str = "sim"  # real stack's engine: prism-sim, or "sglang-cpu" (real SGLang)
    sglang_python: str = ".venv-sglang/bin/python"
    kv_capacity_tokens: int | None = None
    qas: str = DEFAULT_QAS_VARIANT  # what plain `prism` runs
    qas_overrides: tuple[tuple[str, float], ...] = ()  # on every prism line
    # zipf_hotspot overrides (None: SPEC §6's defaults)
    hot_count: int | None = None
    alpha: float | None = None
    r_hot: float | None = None
    max_tokens: int | None = None
    model: str = "tiny"  # --backend sglang-cpu's model (loadgen.stack.cpu_models)
    # How clients talk to the proxy: "prism" (segment hints) or "openai" (plain chat,
    # documents in `layout`, as an unmodified client sends them)
    client_api: str = "prism"
    layout: str = "blank"
    # Every seed of a repeated sweep (empty: `seed` alone); `seed` is the one running
    seeds: tuple[int, ...] = ()

    @property
    def seed_list(self) -> tuple[int, ...]:
        """The seeds the sweep runs, each a full sweep on its own traces."""
        return self.seeds or (self.seed,)

    def trace_overrides(self) -> dict[str, Any]:
        names = ("hot_count", "alpha", "r_hot", "max_tokens")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


def trace_path(config: SweepConfig, qps: float) -> Path:
    name = f"{config.workload}_n{config.num_requests}_qps{qps:g}_seed{config.seed}.jsonl"
    return config.out / "traces" / name


def result_path(config: SweepConfig, line: Line, qps: float) -> Path:
    safe = line.label.replace("[", "-").replace("]", "").replace("=", "").replace("+", "p")
    safe = safe.replace(";", "-")  # a spec's settings (`prism[q_cold=4;prefill_batch=8]`)
    seed = f"_seed{config.seed}" if len(config.seed_list) > 1 else ""
    return config.out / "results" / f"{safe}_qps{qps:g}{seed}.json"


def line_record(line: Line) -> dict[str, Any]:
    """A line as the sweep's results (`variant`) and `sweep.json` (`variants`) record it;
    the report and `twin_vs_real` read them back."""
    return {
        "label": line.label,
        "policy": line.policy,
        "eviction": line.eviction,
        "q_cold": dict(line.qas_overrides).get("q_cold"),
        "schedule_policy": line.schedule_policy,
        "prefill_batch": line.prefill_batch,
        "qas": line.qas,
        "peer": line.peer,
    }


def ensure_trace(config: SweepConfig, qps: float) -> Path:
    """Generate the trace for ``qps`` once (same prompts at every QPS: same seed)."""
    path = trace_path(config, qps)
    if path.exists():
        return path
    from loadgen.workloads.agent_trace import AgentTraceParams, build_agent_trace
    from loadgen.workloads.rag_trace import RagTraceParams, build_rag_trace
    from loadgen.workloads.reorder_trace import ReorderTraceParams, build_reorder_trace
    from loadgen.workloads.trace_format import write_trace
    from prism_tokens.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(config.tokenizer)
    if config.workload == "rag":
        params = RagTraceParams(
            num_requests=config.num_requests,
            qps=qps,
            corpus=config.corpus,
            **config.trace_overrides(),
        )
        header, requests = build_rag_trace(params, config.seed, tokenizer, config.tokenizer)
    elif config.workload == "reorder":
        reorder = ReorderTraceParams(num_requests=config.num_requests, qps=qps)
        header, requests = build_reorder_trace(reorder, config.seed, tokenizer, config.tokenizer)
    else:
        agent = AgentTraceParams(
            num_requests=config.num_requests, qps=qps, tau2_dir=config.tau2_dir
        )
        header, requests = build_agent_trace(agent, config.seed, tokenizer, config.tokenizer)
    write_trace(path, header, requests)
    return path


def sim_command(config: SweepConfig, line: Line, control_port: int) -> list[str]:
    """Arguments of `prism_sim` (the control token goes in its environment, `run`)."""
    settings = {
        "profile": config.profile,
        "speed": config.speed,
        **line_engine_settings(line),
        "seed": config.seed,
        "tokenizer": config.tokenizer,
        "kv_capacity_tokens": config.kv_capacity_tokens,
        "control_port": control_port if has_control_rpc(config, line) else None,
    }
    return [*engine_args(settings), *config.sim_args]


def has_control_rpc(config: SweepConfig, line: Line) -> bool:
    """Whether the line's engine serves DART's control RPC and the proxy pushes to it:
    `prism`'s lines, except on a real SGLang running its own LRU cache (no plugin)."""
    stock = config.backend == "sglang-cpu" and line.eviction == "lru"
    return line.pushes_priorities and not stock


def line_settings(config: SweepConfig, line: Line) -> dict[str, Any]:
    """The settings a line is run with, as the sweep sets them: for prism
    lines the QAS variant and its resolved parameters; the window (modeled ms), the
    prefill batch B (fixed, or "auto": the proxy's rule), the residency source prism
    will use, the eviction order, whether the control RPC is on, and how clients talk.
    `--proxy-arg`s may change them; each run records the proxy's own account."""
    proxied, prism = line.policy is not None, line.policy == "prism"
    qas = line_qas(line, config.qas, config.qas_overrides) if prism else None
    control = has_control_rpc(config, line)
    residency = None
    if qas is not None:
        residency = "none" if qas.w_c <= 0 else ("dart" if control else "view")
    client_api = config.client_api if proxied else "native"
    if line.peer is not None:  # a third party's server, sent plain chat
        client_api = "openai"
    return {
        "policy": line.policy,
        "peer": line.peer,
        "qas_variant": (line.qas or config.qas) if prism else None,
        "qas": asdict(qas) if qas is not None else None,
        "window_ms": config.window_ms if proxied else None,
        "prefill_batch": (line.prefill_batch or "auto") if proxied else None,
        "residency": residency,
        "eviction": line.eviction,
        "schedule_policy": line.schedule_policy,
        "control_rpc": control,
        "client_api": client_api,
        "layout": config.layout if client_api == "openai" else None,
        "proxy_args": list(config.proxy_args) if proxied else [],
    }


def sglang_cpu_command(config: SweepConfig, line: Line, control_port: int) -> list[str]:
    """Arguments of `sglang_cpu.serve`: a real SGLang on this CPU.

    Lines on plain LRU (the baselines, native SGLang, `prism[eviction=lru]`) run SGLang's own
    radix cache (SPEC §5); the other orders run the DART plugin with that order."""
    stock = line.eviction == "lru"
    model = CPU_MODELS[config.model]
    settings = {
        "model": model.name,
        "eviction": "stock" if stock else line.eviction,
        "max_total_tokens": config.kv_capacity_tokens or model.kv_tokens,
        "seed": config.seed,
        "control_port": control_port if has_control_rpc(config, line) else None,
        "sglang": {**model.sglang, "schedule_policy": line.schedule_policy},
    }
    return [*engine_args(settings), *config.sim_args]


def proxy_command(config: SweepConfig, line: Line, backend: str, control_port: int) -> list[str]:
    """Arguments of `prism-proxy serve` for `line` (the control token goes in its
    environment, `run_point`): the run's settings, then the line's (`line_proxy_settings`
    with the sweep's QAS variant and `--set qas.NAME=X`; `policy`, given again there,
    keeps its place), then `--proxy-arg`s."""
    settings: dict[str, Any] = {
        "backend": backend,
        "policy": line.policy,
        "tokenizer": config.tokenizer,
        "window_ms": config.window_ms / config.speed,
        "log_level": "warning",
        "control_url": (
            f"http://127.0.0.1:{control_port}" if has_control_rpc(config, line) else None
        ),
    }
    settings |= line_proxy_settings(
        line, qas=config.qas, qas_overrides=config.qas_overrides, speed=config.speed
    )
    return [*proxy_args(settings), *config.proxy_args]


def engine_state(url: str) -> dict[str, Any]:
    """The engine's own view after a run (``/server_info``): loop lag, evictions, …"""
    import httpx  # the loadgen extra (`prism-loadgen --help` runs without it)

    try:
        info = httpx.get(url + "/server_info", timeout=10.0).json()
        states = info.get("internal_states") or [{}]
        return {**states[0], "radix_eviction_policy": info.get("radix_eviction_policy")}
    except (httpx.HTTPError, ValueError):
        return {}


def proxy_counters(url: str) -> dict[str, float]:
    """The proxy's ``prism:`` counters, gauges and histogram sums/counts after a run,
    summed over labels."""
    import httpx  # the loadgen extra (`prism-loadgen --help` runs without it)

    try:
        return metric_totals(httpx.get(url + "/metrics", timeout=10.0).text)
    except httpx.HTTPError:
        return {}


def proxy_settings(url: str) -> dict[str, Any] | None:
    """The settings the proxy ran with, by its own account (`/server_info`'s
    `prism.settings`), or None when it cannot tell."""
    import httpx  # the loadgen extra (`prism-loadgen --help` runs without it)

    try:
        info = httpx.get(url + "/server_info", timeout=30.0).json()
    except (httpx.HTTPError, ValueError):
        return None
    prism = info.get("prism") if isinstance(info, dict) else None
    return prism.get("settings") if isinstance(prism, dict) else None


def metric_totals(text: str) -> dict[str, float]:
    """Counter, gauge and histogram sum/count samples of a Prometheus text page, each
    sample name's values summed over its labels (``_created`` and ``_bucket`` left out)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.type not in ("counter", "gauge", "histogram"):
            continue
        for sample in family.samples:
            if sample.name.endswith(("_created", "_bucket")):
                continue
            totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
    return totals


def run_point(config: SweepConfig, line: Line, qps: float) -> dict[str, Any]:
    """One point on the real stack: fresh engine (+ proxy), one replay; the results."""
    from loadgen.clients.replay import ReplayConfig, replay
    from loadgen.workloads.trace_format import read_trace

    trace = read_trace(ensure_trace(config, qps))
    logs = config.out / "logs"
    # The control token in the environment of the engine and the proxy, never on a command
    # line (readable by every local user).
    secret = {"PRISM_CONTROL_TOKEN": secrets.token_hex(16)}
    control_port = free_port()
    if config.backend == "sglang-cpu":
        module, python, timeout_s = "sglang_cpu.serve", config.sglang_python, 300.0
        sim_args = sglang_cpu_command(config, line, control_port)
    else:
        module, python, timeout_s = "prism_sim", sys.executable, 60.0
        sim_args = sim_command(config, line, control_port)
    proxy_args: list[str] = []
    settings: dict[str, Any] | None = None
    reorder_url: str | None = None
    engine_name = f"{config.backend}-{line.label}"
    with (
        run_server(
            module, sim_args, log_dir=logs, name=engine_name, python=python,
            startup_timeout_s=timeout_s, env=secret,
        ) as sim,
        contextlib.ExitStack() as stack,
    ):  # fmt: skip
        target, api = sim.url, "native"
        if line.peer is not None:  # a third party's own server (loadgen.stack.peer_lines)
            from loadgen.stack.peer_lines import PEER_SERVERS, run_peer_server

            peer_server = PEER_SERVERS[line.peer]
            peer = stack.enter_context(run_peer_server(peer_server, sim.url, log_dir=logs))
            api = "openai"
            if peer_server.sends_to == "server":
                target = peer.url
            else:  # the client asks the peer for an order, then sends to the engine
                reorder_url = peer.url + (peer_server.reorder_path or "")
        elif line.policy is not None:
            proxy_args = proxy_command(config, line, sim.url, control_port)
            proxy = stack.enter_context(
                run_server(
                    "prism_proxy",
                    proxy_args,
                    log_dir=logs,
                    name=f"proxy-{line.label}",
                    env=secret,
                )
            )
            target, api = proxy.url, config.client_api
        replay_config = ReplayConfig(
            target=target,
            api=api,
            layout=config.layout,
            time_scale=config.speed,
            progress=False,
            reorder_url=reorder_url,
        )
        results = asyncio.run(replay(trace, replay_config))
        results["engine_state"] = engine_state(sim.url)
        if line.policy is not None:
            results["proxy_metrics"] = proxy_counters(target)
            settings = proxy_settings(target)
    results["variant"] = {
        **line_record(line),
        "qps": qps,
        "engine": config.backend,
        "speed": config.speed,
        "profile": config.profile,
        "sim_args": sim_args,
        "proxy_args": proxy_args,
        "client_api": api,
        "layout": config.layout if api == "openai" else None,
        "seed": config.seed,
        "proxy_settings": settings,
    }
    if line.peer is not None:
        from loadgen.stack.peer_lines import peer_record

        results["variant"]["peer_server"] = peer_record(peer_server, sim.url, config.layout, peer)
    return results


def run_point_twin(config: SweepConfig, line: Line, qps: float) -> dict[str, Any]:
    """One point in the twin (modeled time, deterministic); the results."""
    if line.peer is not None:
        from loadgen.stack.peer_lines import TWIN_REFUSAL

        raise ValueError(TWIN_REFUSAL)
    if config.client_api not in ("prism", "openai"):
        raise ValueError("the twin replays hinted requests or plain chat (--set client_api=openai)")
    from loadgen.twin.line_setup import twin_setup
    from loadgen.twin.twin import simulate
    from loadgen.workloads.trace_format import read_trace
    from prism_tokens.tokenizer import load_tokenizer

    trace = read_trace(ensure_trace(config, qps))
    setup = twin_setup(
        line,
        qas=config.qas,
        qas_overrides=config.qas_overrides,
        window_s=config.window_ms / 1000.0,
        profile=config.profile,
        kv_capacity_tokens=config.kv_capacity_tokens,
        seed=config.seed,
        layout=config.layout if config.client_api == "openai" else None,
    )
    results = simulate(trace, setup, load_tokenizer(config.tokenizer))
    results["variant"] = {
        **line_record(line),
        "qps": qps,
        "engine": "twin",
        "profile": config.profile,
        "client_api": config.client_api if line.policy is not None else "native",
        "layout": setup.layout if line.policy is not None else None,
        "seed": config.seed,
        "twin_setup": asdict(setup),
    }
    return results


PointRunner = Callable[[SweepConfig, Line, float], dict[str, Any]]
RUNNERS: dict[str, PointRunner] = {"sim": run_point, "twin": run_point_twin}


def run_sweep(config: SweepConfig, command: str) -> list[Path]:
    """Every line at every QPS on `config.engine`, once per seed (each seed a full
    sweep on its own traces), writing each result as it comes; returns the result files
    (the report is the caller's)."""
    from loadgen.clients.replay import write_results

    config.out.mkdir(parents=True, exist_ok=True)
    for stale in (config.out / "results").glob("*.json"):
        stale.unlink()  # results/ is this sweep's own output: the report reads all of it
    manifest = {
        "command": command,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "engine": config.engine if config.engine == "twin" else config.backend,
        "variants": [line_record(line) for line in config.lines],
        "qps": list(config.qps),
        "speed": config.speed,
        "num_requests": config.num_requests,
        "seed": config.seed_list[0],
        "seeds": list(config.seed_list),
        "profile": config.profile,
        "workload": config.workload,
        "kv_capacity_tokens": config.kv_capacity_tokens,
        "model": config.model,
        "tokenizer": config.tokenizer,
        "trace_overrides": config.trace_overrides(),
        "client_api": config.client_api,
        "layout": config.layout if config.client_api == "openai" else None,
        "window_ms": config.window_ms,
        "qas": config.qas,
        "qas_overrides": dict(config.qas_overrides),
        "sim_args": list(config.sim_args),
        "proxy_args": list(config.proxy_args),
        "settings": {line.label: line_settings(config, line) for line in config.lines},
        "git_commit": git_commit(),
    }
    (config.out / "sweep.json").write_text(json.dumps(manifest, indent=1) + "\n")
    run = RUNNERS[config.engine]
    paths = []
    repeated = len(config.seed_list) > 1
    for seed in config.seed_list:
        seeded = replace(config, seed=seed)
        for qps in config.qps:
            ensure_trace(seeded, qps)
        for line in config.lines:
            for qps in config.qps:
                started = time.monotonic()
                results = run(seeded, line, qps)
                path = result_path(seeded, line, qps)
                write_results(path, results)
                summary = results["summary"]
                print(
                    f"{line.label:>18} @ {qps:g} QPS{f' seed {seed}' if repeated else ''}: "
                    f"p99 TTFT {_fmt_s(summary['p99_ttft_ms'])}, "
                    f"hit {_fmt_pct(summary['hit_rate'])}, "
                    f"{summary['request_throughput']:.1f} req/s, failed {summary['failed']}"
                    f" ({time.monotonic() - started:.0f}s wall)",
                    flush=True,
                )
                paths.append(path)
    return paths


def git_commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def _fmt_s(ms: float | None) -> str:
    return "n/a" if ms is None else f"{ms / 1000:.2f}s"


def _fmt_pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def add_sweep_flags(parser: argparse.ArgumentParser, *, real_stack: bool = True) -> None:
    """The flags of `sweep` (`real_stack`) and `simulate` (the twin: no wall clock, no
    backend flags). The sweep's rarer settings are `--set KEY=VALUE` (`SWEEP_SETTINGS`),
    a line's ablations its spec in `--policies`."""
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--policies",
        default=",".join(ALL_POLICIES),
        help="comma-separated lines, each a name or name[key=value;...] with keys "
        + ", ".join(LINE_KEYS)
        + " (e.g. prism[eviction=lru], fifo[prefill_batch=8]; docs/experiments.md; default: "
        "all but the peer lines)",
    )
    parser.add_argument("--qps", default=",".join(f"{q:g}" for q in DEFAULT_QPS))
    parser.add_argument(
        "--workload",
        choices=("rag", "agent", "reorder"),
        default="rag",
        help="zipf_hotspot, agent_prefix, or reorder_replay",
    )
    parser.add_argument("--num-requests", type=int, default=2048)
    parser.add_argument(
        "--seed",
        default="0",
        metavar="LIST",
        help="trace and engine seed; several (0,1,2): the whole sweep once per seed, the "
        "report's means with 95%% intervals",
    )
    parser.add_argument(
        "--trace-param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="the trace's shape: " + ", ".join(TRACE_PARAMS) + " (repeatable)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the sweep (repeatable): "
        + ", ".join(f"{key} [{default}]" for key, default in setting_defaults().items())
        + "; qas.NAME=X: a numeric QAS parameter on every prism line (qas.cold_deadline_ms=1000)",
    )
    if real_stack:
        parser.add_argument("--speed", type=float, default=1.0, help="engine clock speed F")
        parser.add_argument(
            "--backend",
            choices=("sim", "sglang-cpu"),
            default="sim",
            help="prism-sim, or a real SGLang on this CPU (make sglang-cpu)",
        )
        parser.add_argument("--sim-arg", action="append", default=[], help="extra prism-sim arg")
        parser.add_argument("--proxy-arg", action="append", default=[], help="extra proxy arg")
    else:
        parser.set_defaults(speed=1.0, backend="sim", sim_arg=[], proxy_arg=[])
    parser.add_argument("--no-report", action="store_true")
    _compact_metavars(parser)


def _compact_metavars(parser: argparse.ArgumentParser) -> None:
    """Short metavars, so that `--help` fits on a screen: a choice's options go to its
    help line, a list's metavar says so."""
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or action.nargs == 0:
            continue
        if action.choices:
            choices = "|".join(str(c) for c in action.choices)
            action.help = f"{action.help}: {choices}" if action.help else choices
            action.metavar = "NAME"
        elif action.metavar is None:
            default = action.default
            is_list = isinstance(default, str) and (default == "" or "," in default)
            action.metavar = "LIST" if is_list else "X"


def model_tokenizer(model: str, tokenizer: str, sglang_python: str) -> str:
    """The tokenizer of trace, proxy and twin: a real model's own directory unless one
    was given (ids must be the model's)."""
    if tokenizer != "builtin":
        return tokenizer
    directory = CPU_MODELS[model].directory(sglang_python)
    return tokenizer if directory is None else str(directory)


def parse_seeds(text: str, seed: int) -> tuple[int, ...]:
    """Seeds as listed (`0,1,2`: distinct integers), else `(seed,)`."""
    seeds = tuple(int(s) for s in _csv(text)) or (seed,)
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds {text}: a seed is listed twice")
    return seeds


# The trace shape's parameters (`--trace-param NAME=VALUE`) and how each is read.
TRACE_PARAMS: dict[str, Callable[[str], Any]] = {
    "hot_count": int,
    "alpha": float,
    "r_hot": float,
    "max_tokens": int,
    "corpus": str,
    "tau2_dir": str,
}


def _trace_params(pairs: list[str]) -> dict[str, Any]:
    """`--trace-param NAME=VALUE` pairs, each read as `TRACE_PARAMS` says (None: unset)."""
    params: dict[str, Any] = dict.fromkeys(TRACE_PARAMS)
    for text in pairs:
        name, sep, value = text.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in TRACE_PARAMS:
            raise ValueError(f"--trace-param {text!r}: expected NAME=VALUE, NAME one of "
                             f"{', '.join(TRACE_PARAMS)}")  # fmt: skip
        params[name] = TRACE_PARAMS[name](value)
    return params


# The sweep's settings given as `--set KEY=VALUE`, each with how its value is read (a
# tuple: the values it may take); their defaults are `SweepConfig`'s.
SWEEP_SETTINGS: dict[str, Callable[[str], Any] | tuple[str, ...]] = {
    "qas": tuple(QAS_VARIANTS),  # what the plain prism line runs ('paper': the paper's QAS)
    "window_ms": float,  # the QAS window, in modeled ms
    "profile": str,  # the engine's time profile
    "kv_capacity_tokens": int,  # the engine's KV pool
    "tokenizer": str,
    "client_api": ("prism", "openai"),  # segment hints, or plain chat (unmodified clients)
    "layout": CHAT_LAYOUTS,  # client_api=openai: where the documents sit
    "model": tuple(CPU_MODELS),  # backend sglang-cpu's model (smollm2: also the tokenizer)
    "sglang_python": str,  # the SGLang environment
}
QAS_PREFIX = "qas."  # `--set qas.NAME=X`: a QAS parameter on every prism line


def setting_defaults() -> dict[str, Any]:
    """Each `--set` key with its default (`SweepConfig`'s)."""
    defaults = {f.name: f.default for f in fields(SweepConfig)}
    return {key: defaults[key] for key in SWEEP_SETTINGS}


def sweep_settings(pairs: list[str]) -> tuple[dict[str, Any], tuple[tuple[str, float], ...]]:
    """`--set KEY=VALUE` pairs: the sweep's settings (defaults for those not given) and
    the QAS parameters set on every prism line (`qas.NAME=X`), in order. ValueError for
    an unknown key or a value its key does not take."""
    settings = setting_defaults()
    qas_overrides: list[tuple[str, float]] = []
    for key, text in parse_settings(pairs).items():
        key = key.replace("-", "_")
        if key.startswith(QAS_PREFIX):
            qas_overrides.append((key.removeprefix(QAS_PREFIX), float(text)))
            continue
        reader = SWEEP_SETTINGS.get(key)
        if reader is None:
            raise ValueError(f"{key!r} is not a sweep setting ({', '.join(SWEEP_SETTINGS)}, "
                             f"{QAS_PREFIX}NAME)")  # fmt: skip
        if isinstance(reader, tuple):
            if text not in reader:
                raise ValueError(f"sweep setting {key}={text}: choose from {', '.join(reader)}")
            settings[key] = text
        else:
            settings[key] = reader(text)
    return settings, tuple(qas_overrides)


def sweep_config_from_args(args: argparse.Namespace, engine: str) -> SweepConfig:
    trace = _trace_params(args.trace_param)
    settings, qas_overrides = sweep_settings(args.set)
    seeds = parse_seeds(args.seed, 0)
    model, sglang_python = settings["model"], settings["sglang_python"]
    return SweepConfig(
        out=Path(args.out),
        lines=spec_lines(_csv(args.policies)),
        qas=settings["qas"],
        qas_overrides=qas_overrides,
        qps=tuple(float(q) for q in _csv(args.qps)),
        workload=args.workload,
        num_requests=args.num_requests,
        seed=seeds[0],
        seeds=seeds if len(seeds) > 1 else (),
        speed=args.speed,
        profile=settings["profile"],
        tokenizer=model_tokenizer(model, settings["tokenizer"], sglang_python),
        corpus=trace["corpus"],
        window_ms=settings["window_ms"],
        tau2_dir=trace["tau2_dir"],
        sim_args=tuple(a for arg in args.sim_arg for a in shlex.split(arg)),
        proxy_args=tuple(a for arg in args.proxy_arg for a in shlex.split(arg)),
        engine=engine,
        backend=args.backend,
        sglang_python=sglang_python,
        kv_capacity_tokens=settings["kv_capacity_tokens"],
        hot_count=trace["hot_count"],
        alpha=trace["alpha"],
        r_hot=trace["r_hot"],
        max_tokens=trace["max_tokens"],
        client_api=settings["client_api"],
        layout=settings["layout"],
        model=model,
    )


def run_sweep_from_args(args: argparse.Namespace, engine: str = "sim") -> int:
    config = sweep_config_from_args(args, engine)
    if engine == "twin" and (config.sim_args or config.proxy_args or config.backend != "sim"):
        raise ValueError("--sim-arg/--proxy-arg/--backend apply to the real stack, not the twin")
    if config.backend == "sglang-cpu" and not Path(config.sglang_python).exists():
        raise ValueError(f"{config.sglang_python} not found: run `make sglang-venv` first")
    if config.backend == "sglang-cpu" and config.speed != 1.0:
        raise ValueError("a real SGLang (backend sglang-cpu) runs in real time: --speed must be 1")
    from loadgen.stack.peer_lines import check_peer_lines

    peers = [line.label for line in config.lines if line.peer is not None]
    check_peer_lines(peers, engine=engine, client_api=config.client_api, layout=config.layout)
    command = "prism-loadgen " + shlex.join(sys.argv[1:])
    run_sweep(config, command)
    if not args.no_report:
        from loadgen.reports.report import write_report

        title = "PRISM sweep (twin, modeled time)" if engine == "twin" else "PRISM sweep"
        paths = write_report(config.out / "results", out_dir=config.out, title=title)
        print(paths.table_text)
        for path in paths.files:
            print(f"wrote {path}")
    return 0
