"""``prism-loadgen``: workloads, replay, sweeps, the twin, reports, quality, scale-out.

prism-loadgen trace rag   --out FILE [--qps 50 --seed 0 --trace-param hot_count=2 ...]
                                                               zipf_hotspot (SPEC §6)
prism-loadgen trace agent --out FILE [--qps 40 ...]            agent_prefix (SPEC §6)
prism-loadgen trace reorder --out FILE [--qps 2 ...]           reorder_replay
prism-loadgen replay --trace FILE --target URL --api prism|openai|sglang --out FILE
prism-loadgen sweep  --out DIR [--policies ... --qps 40,50,60,70,80 --speed F]
prism-loadgen simulate --out DIR [same flags as sweep]          the twin, modeled time
prism-loadgen sessions --out DIR [--rate 0.5 --kv-fraction 1,0.5,0.25 ...]  agent_sessions
                                                                in the twin
prism-loadgen scale-out --out DIR [--replicas 3 --qps 40,120]  N replicas behind smg
prism-loadgen quality --out DIR [--orders fifo,prism,...]  answer F1 by document order
prism-loadgen report --results DIR
prism-loadgen demo   [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from loadgen.clients.apis import API_NAMES, CHAT_LAYOUTS
from loadgen.clients.routing import ROUTING_KEYS
from loadgen.stack.processes import parse_settings
from loadgen.workloads.trace_format import read_trace, write_trace
from loadgen.workloads.trace_params import (
    AgentTraceParams,
    RagTraceParams,
    ReorderTraceParams,
    SessionParams,
)

# What the `loadgen` extra installs, by import name: the subcommands import them (below
# the argument parser, so `prism-loadgen --help` runs without them).
LOADGEN_EXTRA_MODULES = frozenset({"numpy", "matplotlib", "tqdm", "httpx", "blake3", "openai"})
EXTRA_HINT = "pip install 'prism-serving[loadgen]'"


# Every workload's two knobs with a flag of their own; the others are `--trace-param`s.
TRACE_FLAGS = ("num_requests", "qps")
# agent_sessions' knobs with a flag of their own (`--sessions`, and the points' `--rate`
# and `--tool-scale`); the others are `--trace-param`s.
SESSION_FLAGS = ("num_sessions", "session_rate", "tool_scale")
REAL_SPEED = 4.0  # `sessions --real`'s engine clock speed when none is given


def _knobs_help(cls: Any, flagged: tuple[str, ...]) -> str:
    """`--trace-param`'s help: the workload's knobs without a flag, with their defaults."""
    knobs = [f"{f.name} [{f.default}]" for f in fields(cls) if f.name not in flagged]
    return "the trace's shape (repeatable): " + ", ".join(knobs)


def _add_trace_flags(parser: argparse.ArgumentParser, cls: Any) -> None:
    """`--num-requests` and `--qps`, and the workload's other knobs (the fields of `cls`)
    as `--trace-param NAME=VALUE`, as the sweep takes them."""
    defaults = {f.name: f.default for f in fields(cls)}
    parser.add_argument("--num-requests", type=int, default=defaults["num_requests"])
    parser.add_argument("--qps", type=float, default=defaults["qps"])
    parser.add_argument(
        "--trace-param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=_knobs_help(cls, TRACE_FLAGS),
    )


def trace_knobs(cls: Any, pairs: list[str], flagged: tuple[str, ...]) -> dict[str, Any]:
    """`--trace-param NAME=VALUE` pairs as the workload's knobs (the fields of `cls`), each
    read as its field's type. ValueError for a name that is not one of its knobs or has a
    flag of its own (`flagged`)."""
    kinds = {f.name: {"int": int, "float": float}.get(str(f.type), str) for f in fields(cls)}
    values: dict[str, Any] = {}
    for name, text in parse_settings(pairs).items():
        name = name.replace("-", "_")
        if name not in kinds or name in flagged:
            knobs = ", ".join(k for k in kinds if k not in flagged)
            raise ValueError(f"--trace-param {name}: not a knob of this workload ({knobs})")
        values[name] = kinds[name](text)
    return values


def _params_from_args(cls: Any, args: argparse.Namespace) -> Any:
    """The workload's parameters: its flags, then its `--trace-param`s."""
    values = {name: getattr(args, name) for name in TRACE_FLAGS}
    return cls(**values, **trace_knobs(cls, args.trace_param, TRACE_FLAGS))


def _tokenizer(spec: str | None) -> tuple[Any, str]:
    from prism_tokens.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(spec or "builtin")
    return tokenizer, tokenizer.name


def cmd_trace(args: argparse.Namespace) -> int:
    from loadgen.workloads.agent_trace import build_agent_trace
    from loadgen.workloads.rag_trace import build_rag_trace
    from loadgen.workloads.reorder_trace import build_reorder_trace

    tokenizer, name = _tokenizer(args.tokenizer)
    if args.workload == "rag":
        params = _params_from_args(RagTraceParams, args)
        header, requests = build_rag_trace(params, args.seed, tokenizer, name)
    elif args.workload == "reorder":
        params = _params_from_args(ReorderTraceParams, args)
        header, requests = build_reorder_trace(params, args.seed, tokenizer, name)
    else:
        params = _params_from_args(AgentTraceParams, args)
        header, requests = build_agent_trace(params, args.seed, tokenizer, name)
    write_trace(Path(args.out), header, requests)
    hot = sum(r.hot for r in requests)
    print(
        f"wrote {len(requests)} requests ({hot} hot) to {args.out}"
        f" [{header.workload}, seed {header.seed}]"
    )
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from loadgen.clients.replay import ReplayConfig, replay, write_results

    trace = read_trace(Path(args.trace))
    config = ReplayConfig(
        target=args.target.rstrip("/"),
        api=args.api,
        layout=args.layout,
        time_scale=args.time_scale,
        model=args.model,
        request_timeout_s=args.timeout,
        progress=True if args.progress else None,
        routing_key=args.routing_key,
        max_replica_share=args.max_replica_share,
    )
    results = asyncio.run(replay(trace, config))
    write_results(Path(args.out), results)
    summary = results["summary"]
    keys = ("completed", "failed", "request_throughput", "hit_rate", "mean_ttft_ms")
    keys += ("median_ttft_ms", "p99_ttft_ms", "mean_e2e_latency_ms")
    print(json.dumps({k: summary[k] for k in keys}, indent=1))
    print(f"results: {args.out}")
    return 0 if summary["completed"] else 1


def cmd_bound(args: argparse.Namespace) -> int:
    from loadgen.workloads.bounds import hit_rate_ceilings
    from prism_proxy.prompts.serializer import Serializer

    tokenizer, _ = _tokenizer(args.tokenizer)
    ceilings = hit_rate_ceilings(read_trace(Path(args.trace)), Serializer(tokenizer))
    print(json.dumps({name: round(value, 4) for name, value in ceilings.items()}, indent=1))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from loadgen.experiments.sweep import run_sweep_from_args

    return run_sweep_from_args(args)


def cmd_simulate(args: argparse.Namespace) -> int:
    from loadgen.experiments.sweep import run_sweep_from_args

    return run_sweep_from_args(args, engine="twin")


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def session_params(args: argparse.Namespace) -> SessionParams:
    """agent_sessions' knobs from `sessions`' flags: `--sessions`, then the
    `--trace-param`s (the points' rate and tool scale are the sweep's own)."""
    knobs = trace_knobs(SessionParams, args.trace_param, SESSION_FLAGS)
    return SessionParams(num_sessions=args.sessions, **knobs)


def cmd_sessions(args: argparse.Namespace) -> int:
    from loadgen.experiments.session_lines import LINES, REAL_LINES
    from loadgen.experiments.session_sweep import Point, sweep

    known = tuple(REAL_LINES if args.real is not None else LINES)
    lines = tuple(args.lines.split(",")) if args.lines else known
    unknown = set(lines) - set(known)
    if unknown:
        raise ValueError(f"unknown lines {sorted(unknown)}; choose from {', '.join(known)}")
    base = session_params(args)
    points = [
        Point(rate, scale, fraction)
        for rate in _floats(args.rate)
        for scale in _floats(args.tool_scale)
        for fraction in _floats(args.kv_fraction)
    ]
    sweep(base, points, lines, Path(args.out), seed=args.seed, tokenizer_spec=args.tokenizer,
          jobs=args.jobs, real_speed=args.real, save_calls=args.save_calls)  # fmt: skip
    print(f"wrote {Path(args.out) / 'report.md'}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from loadgen.reports.report import write_report

    paths = write_report(Path(args.results), title=args.title)
    print(paths.table_text)
    for path in paths.files:
        print(f"wrote {path}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from loadgen.experiments.demo import run_demo

    return run_demo(Path(args.out), speed=args.speed, num_requests=args.num_requests)


def build_parser() -> argparse.ArgumentParser:
    from loadgen.experiments.sweep import add_sweep_flags

    parser = argparse.ArgumentParser(
        prog="prism-loadgen", description=__doc__.split("\n")[0].replace("``", "")
    )
    sub = parser.add_subparsers(dest="command", required=True)

    trace = sub.add_parser("trace", help="generate a trace (JSONL)")
    trace_sub = trace.add_subparsers(dest="workload", required=True)
    rag = trace_sub.add_parser("rag", help="zipf_hotspot RAG trace (SPEC §6)")
    _add_trace_flags(rag, RagTraceParams)
    agent = trace_sub.add_parser("agent", help="agent_prefix trace (SPEC §6)")
    _add_trace_flags(agent, AgentTraceParams)
    reorder = trace_sub.add_parser(
        "reorder", help="reorder_replay: earlier document sets again in a new order"
    )
    _add_trace_flags(reorder, ReorderTraceParams)
    for p in (rag, agent, reorder):
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--tokenizer", default="builtin", help="'builtin' or a model dir")
        p.add_argument("--out", required=True, help="output JSONL path")
        p.set_defaults(func=cmd_trace)

    rep = sub.add_parser("replay", help="open-loop replay of a trace against a target")
    rep.add_argument("--trace", required=True)
    rep.add_argument("--target", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    rep.add_argument("--api", choices=API_NAMES, default="prism")
    rep.add_argument(
        "--layout",
        choices=CHAT_LAYOUTS,
        default="blank",
        help="--api openai: how the documents sit in the user message (tool: in a tool result)",
    )
    rep.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="backend clock speed F (prism-sim --speed F): send F× faster, report times ×F",
    )
    rep.add_argument("--model", default=None, help="model name (default: first of /v1/models)")
    rep.add_argument("--timeout", type=float, default=600.0, help="per-request read timeout (s)")
    rep.add_argument(
        "--routing-key",
        choices=ROUTING_KEYS,
        default="none",
        help="send X-SMG-Routing-Key (a gateway in front): canonical = the request's first"
        " segment in PRISM's canonical order (what a client computes); anchor = its"
        " hottest segment by the trace's hot ranks (the generator's knowledge);"
        " anchor-bounded spreads hot anchors (loadgen.clients.hot_keys)",
    )
    rep.add_argument(
        "--max-replica-share",
        type=float,
        default=0.4,
        help="anchor-bounded: a hot key never sends to a replica holding this share of the"
        " last 256 requests (default: 0.4)",
    )
    rep.add_argument("--progress", action="store_true", help="force the progress bar")
    rep.add_argument("--out", required=True, help="results JSON path")
    rep.set_defaults(func=cmd_replay)

    bound = sub.add_parser("bound", help="hit-rate ceilings of a trace (infinite cache)")
    bound.add_argument("--trace", required=True)
    bound.add_argument("--tokenizer", default="builtin")
    bound.set_defaults(func=cmd_bound)

    sweep = sub.add_parser("sweep", help="policies × QPS on fresh sim + proxy; report")
    add_sweep_flags(sweep)
    sweep.set_defaults(func=cmd_sweep)

    simulate = sub.add_parser(
        "simulate", help="the same sweep in the twin: proxy + engine in modeled time"
    )
    add_sweep_flags(simulate, real_stack=False)
    simulate.set_defaults(func=cmd_simulate)

    sessions = sub.add_parser(
        "sessions", help="agent_sessions: every line in the twin over rate x tool scale x pool"
    )
    sessions.add_argument("--out", required=True)
    sessions.add_argument("--sessions", type=int, default=100, help="sessions per run")
    sessions.add_argument("--rate", default="0.5", help="sessions per second, comma-separated")
    sessions.add_argument("--tool-scale", default="3", help="tool-duration scales")
    sessions.add_argument(
        "--kv-fraction", default="1,0.5,0.25", help="pools, as fractions of the live unique KV"
    )
    sessions.add_argument("--lines", default=None, help="comma-separated (default: all)")
    sessions.add_argument(
        "--trace-param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=_knobs_help(SessionParams, SESSION_FLAGS)
        + " (source: auto|tau2|synthetic agent material; tool_model: independent, one"
        " distribution of tool durations and outputs, or by_tool, by the tool's kind)",
    )
    sessions.add_argument("--seed", type=int, default=0)
    sessions.add_argument("--tokenizer", default="builtin")
    sessions.add_argument("--jobs", type=int, default=2, help="twin runs at once (processes)")
    sessions.add_argument(
        "--real",
        type=float,
        nargs="?",
        const=REAL_SPEED,
        default=None,
        metavar="SPEED",
        help="the real stack: prism-sim over HTTP at this clock speed (default "
        f"{REAL_SPEED:g}), the proxy",
    )
    sessions.add_argument(
        "--save-calls",
        action="store_true",
        help="write each run's per-call records (client and engine timelines) to OUT/calls/",
    )
    sessions.set_defaults(func=cmd_sessions)

    report = sub.add_parser("report", help="table and plots from a sweep's results dir")
    report.add_argument("--results", required=True)
    report.add_argument("--title", default="PRISM sweep")
    report.set_defaults(func=cmd_report)

    demo = sub.add_parser("demo", help="fifo vs klpm vs prism across the knee, in minutes")
    demo.add_argument("--out", default="demo-results")
    demo.add_argument("--speed", type=float, default=None)
    demo.add_argument("--num-requests", type=int, default=None)
    demo.set_defaults(func=cmd_demo)

    # Listed here for --help; `main` hands their arguments to their own parsers.
    for name, text in (
        ("quality", "answer F1 by document order on a real model (its own --help)"),
        ("scale-out", "N replicas behind sgl-model-gateway, two topologies (its own --help)"),
    ):
        sub.add_parser(name, help=text, add_help=False)
    return parser


def _quality_parser() -> argparse.ArgumentParser:
    from loadgen.quality.run import build_parser as quality_parser

    return quality_parser()


def _scale_out_parser() -> argparse.ArgumentParser:
    from loadgen.experiments.scale_out import build_parser as scale_out_parser

    return scale_out_parser()


# The subcommands that parse their own arguments, with their parsers (for measuring them:
# `bench.loadgen_options`).
OWN_PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "quality": _quality_parser,
    "scale-out": _scale_out_parser,
}


def _run(argv: list[str]) -> int:
    if argv[:1] == ["scale-out"]:  # its own flags (loadgen/experiments/scale_out.py)
        from loadgen.experiments.scale_out import main as scale_out

        return scale_out(argv[1:])
    if argv[:1] == ["quality"]:  # its own flags (loadgen/quality/run.py)
        from loadgen.quality.run import main as quality

        return quality(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ValueError, FileNotFoundError) as exc:
        print(f"prism-loadgen: error: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _run(argv)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in LOADGEN_EXTRA_MODULES:
            raise
        command = argv[0] if argv else "prism-loadgen"
        print(
            f"prism-loadgen: error: {command!r} needs {missing!r}, from the loadgen extra: "
            f"{EXTRA_HINT}",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
