"""`prism-loadgen quality`: answer quality by document order, through the proxy.

    prism-loadgen quality --out runs/quality [--engine sglang-cpu --model smollm2]
        [--orders fifo,prism,adversarial,no-answer] [--questions 240] [--concurrency 4]
        [--layout blank|xml|numbered|markdown|dashed|metadata|tool|numbered-...]

For each order, on a fresh engine and proxy (the engine runs DART with its control RPC
for every order, so only the order differs): every question of the answer_quality
trace (`trace.py`) is asked through the proxy with the real `openai` client (chat,
the segments in `extra_body={"prism": ...}`, temperature 0), `--concurrency` at a time
in trace order. With `--layout`, the client is unmodified instead: no hints, the
passages in that chat layout (`loadgen.clients.apis.chat_messages`: in the user message, or
in a retrieval tool's result for `tool`), so under
`prism` the proxy finds them itself and reorders them (its defaults), and `fifo` is the
client's own text. Each answer is scored against its references (SQuAD F1 and EM,
`metrics.py`); the report gives each order's means with 95 % bootstrap intervals, the
paired difference against `fifo` over the same questions, how many answers changed,
and the exact-prefix hit rate (cached / prompt tokens from the responses' usage).

`--engine sglang-cpu` is an unmodified SGLang on this CPU (`sglang_cpu.
serve`, in `.venv-sglang`) serving SmolLM2-135M-Instruct (`--model smollm2`; the tiny
test model answers noise). `--engine sim` is prism-sim, whose answers are noise too:
it checks the harness.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadgen.clients.apis import CHAT_LAYOUTS, chat_messages, prism_hint
from loadgen.quality.metrics import best_scores, bootstrap_mean, paired_difference
from loadgen.quality.orders import ORDERS, PROXY_POLICY, answer_positions, arranged_request
from loadgen.quality.trace import QualityTraceParams, build_quality_trace
from loadgen.stack.cpu_models import CPU_MODELS
from loadgen.stack.processes import (
    ServerProcess,
    engine_args,
    free_port,
    proxy_args,
    run_server,
)
from loadgen.workloads.trace_format import TraceRequest, read_trace, write_trace

DEFAULT_ORDERS = ("fifo", "prism", "adversarial", "no-answer")
SGLANG_PYTHON = ".venv-sglang/bin/python"
KV_TOKENS = 32768  # room for the whole trace's distinct text (~25k tokens with SmolLM2)


@dataclass(frozen=True)
class QualityConfig:
    out: Path
    engine: str = "sglang-cpu"
    model: str = "smollm2"
    orders: tuple[str, ...] = DEFAULT_ORDERS
    questions: int = 240
    concurrency: int = 4
    seed: int = 0
    trace: Path | None = None
    sglang_python: str = SGLANG_PYTHON
    qas: str = "full"
    layout: str | None = None  # None: hinted requests; else plain chat in this layout

    def __post_init__(self) -> None:
        unknown = [o for o in self.orders if o not in ORDERS]
        if unknown or not self.orders:
            raise ValueError(f"orders must be among {', '.join(ORDERS)} (got {unknown or '[]'})")
        if self.engine not in ("sglang-cpu", "sim"):
            raise ValueError("engine is 'sglang-cpu' or 'sim'")
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.layout is not None and self.layout not in CHAT_LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(CHAT_LAYOUTS)}")


def model_directory(config: QualityConfig) -> str:
    """The proxy's tokenizer: the served model's directory (prepared if needed), or the
    builtin tokenizer for prism-sim."""
    if config.engine == "sim":
        return "builtin"
    return str(CPU_MODELS[config.model].directory(config.sglang_python))


@contextlib.contextmanager
def stack(config: QualityConfig, order: str, tokenizer: str) -> Iterator[ServerProcess]:
    """A fresh engine (DART + control RPC) and a proxy with `order`'s policy in front."""
    logs = config.out / "logs"
    token, control_port = secrets.token_hex(16), free_port()
    secret = {"PRISM_CONTROL_TOKEN": token}  # in the environment: never on a command line
    if config.engine == "sim":
        settings = {"tokenizer": tokenizer, "eviction": "dart", "control_port": control_port}
        engine = ("prism_sim", engine_args(settings), sys.executable, 60.0)
    else:
        settings = {"model": config.model, "max_total_tokens": KV_TOKENS}
        args = engine_args({**settings, "control_port": control_port})
        engine = ("sglang_cpu.serve", args, config.sglang_python, 300.0)
    module, args, python, timeout_s = engine
    with run_server(
        module,
        args,
        log_dir=logs,
        name=f"engine-{order}",
        python=python,
        startup_timeout_s=timeout_s,
        env=secret,
    ) as server:
        policy = PROXY_POLICY[order]
        settings = {"backend": server.url, "policy": policy, "tokenizer": tokenizer}
        settings["log_level"] = "warning"
        if policy == "prism":
            settings |= {"qas": config.qas, "control_url": f"http://127.0.0.1:{control_port}"}
        with run_server(
            "prism_proxy", proxy_args(settings), log_dir=logs, name=f"proxy-{order}", env=secret
        ) as proxy:
            yield proxy


async def ask_all(
    target: str, requests: Sequence[TraceRequest], concurrency: int, layout: str | None = None
) -> list[dict[str, Any]]:
    """Every request through the proxy's chat endpoint with the `openai` client, hinted
    or (`layout`) plain; one record per request, in order (a failure is a record with
    its error)."""
    from openai import AsyncOpenAI, OpenAIError

    client = AsyncOpenAI(base_url=target + "/v1", api_key="prism", max_retries=0, timeout=600)
    model = (await client.models.list()).data[0].id
    gate = asyncio.Semaphore(concurrency)

    async def ask(request: TraceRequest) -> dict[str, Any]:
        messages: list[Any] = chat_messages(request, layout)
        extra = {"prism": prism_hint(request)} if layout is None else None
        record: dict[str, Any] = {"rid": request.rid}
        async with gate:
            started = time.perf_counter()
            try:
                response = await client.chat.completions.create(
                    model=model,
                    messages=messages,
                    max_tokens=request.max_tokens,
                    temperature=0.0,
                    extra_body=extra,
                )
            except OpenAIError as exc:
                return {**record, "error": f"{type(exc).__name__}: {exc}"[:300]}
            record["latency_s"] = time.perf_counter() - started
        usage = response.usage
        details = usage.prompt_tokens_details if usage else None
        return {
            **record,
            "answer": response.choices[0].message.content or "",
            "prompt_tokens": usage.prompt_tokens if usage else 0,
            "cached_tokens": (details.cached_tokens or 0) if details else 0,
        }

    try:
        return list(await asyncio.gather(*(ask(r) for r in requests)))
    finally:
        await client.close()


def score(requests: Sequence[TraceRequest], records: Sequence[dict[str, Any]], order: str):
    """Per-question scores of one order (records and requests in the same order)."""
    rows = []
    for request, record in zip(requests, records, strict=True):
        answer = record.get("answer")
        scores = (0.0, 0.0, 0.0)
        if answer is not None:
            scores = best_scores(answer, request.meta["answers"])
        f1, em, contains = scores
        rows.append(
            {
                **record,
                "order": order,
                "f1": f1,
                "em": em,
                "contains": contains,
                # where the client put the evidence; under prism QAS decides (unknown here)
                "answer_positions": None
                if order == "prism"
                else answer_positions(request.segments, request.meta["answer_segments"]),
            }
        )
    return rows


def run_order(config: QualityConfig, order: str, trace: list[TraceRequest], tokenizer: str):
    requests = [arranged_request(r, order) for r in trace]
    started = time.perf_counter()
    with stack(config, order, tokenizer) as proxy:
        records = asyncio.run(ask_all(proxy.url, requests, config.concurrency, config.layout))
    rows = score(requests, records, order)
    print(
        f"quality: {order}: {len(rows)} questions in {time.perf_counter() - started:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    return rows


def summarize(by_order: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each order's means, intervals, paired differences against fifo, and hit rate."""
    summary: dict[str, Any] = {}
    reference = by_order.get("fifo")
    for order, rows in by_order.items():
        f1s, ems, hits = ([r[m] for r in rows] for m in ("f1", "em", "contains"))
        prompt = sum(r.get("prompt_tokens", 0) for r in rows)
        entry: dict[str, Any] = {
            "questions": len(rows),
            "failed": sum("error" in r for r in rows),
            "f1": asdict(bootstrap_mean(f1s)),
            "em": asdict(bootstrap_mean(ems)),
            "contains": asdict(bootstrap_mean(hits)),
            "hit_rate": sum(r.get("cached_tokens", 0) for r in rows) / prompt if prompt else 0.0,
            "mean_latency_s": sum(r.get("latency_s", 0.0) for r in rows) / max(1, len(rows)),
        }
        if reference is not None and order != "fifo":
            for metric, values in (("f1", f1s), ("em", ems), ("contains", hits)):
                base = [r[metric] for r in reference]
                entry[f"{metric}_minus_fifo"] = asdict(paired_difference(values, base))
            entry["answers_changed"] = sum(
                a.get("answer") != b.get("answer") for a, b in zip(rows, reference, strict=True)
            )
        summary[order] = entry
    if reference is not None:
        summary["fifo"]["f1_by_answer_position"] = by_position(reference)
    return summary


def by_position(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """F1 of the questions with one answer-bearing passage, by that passage's position."""
    groups: dict[int, list[float]] = {}
    for row in rows:
        if row["answer_positions"] and len(row["answer_positions"]) == 1:
            groups.setdefault(row["answer_positions"][0], []).append(row["f1"])
    return {
        str(position): {"n": len(values), **asdict(bootstrap_mean(values))}
        for position, values in sorted(groups.items())
    }


def _interval(entry: dict[str, float], signed: bool = False) -> str:
    sign = "+" if signed else ""
    return f"{entry['mean']:{sign}.3f} [{entry['low']:{sign}.3f}, {entry['high']:{sign}.3f}]"


def report_table(summary: dict[str, Any]) -> str:
    """The markdown table of a run."""
    lines = [
        "| order | questions | F1 | F1 − fifo, paired | contains answer "
        "| contains − fifo, paired | EM | answers changed vs fifo | hit rate | mean latency |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def diff(entry: dict[str, Any], metric: str) -> str:
        key = f"{metric}_minus_fifo"
        return _interval(entry[key], signed=True) if key in entry else "—"

    for order, entry in summary.items():
        failed = f" ({entry['failed']} failed)" if entry["failed"] else ""
        lines.append(
            f"| {order} | {entry['questions']}{failed} | {_interval(entry['f1'])} "
            f"| {diff(entry, 'f1')} | {_interval(entry['contains'])} "
            f"| {diff(entry, 'contains')} | {_interval(entry['em'])} "
            f"| {entry.get('answers_changed', '—')} | {100 * entry['hit_rate']:.1f} % "
            f"| {entry['mean_latency_s']:.2f} s |"
        )
    return "\n".join(lines) + "\n\nMeans over questions with 95 % bootstrap intervals."


def ensure_trace(config: QualityConfig) -> Path:
    if config.trace is not None:
        return config.trace
    path = config.out / f"answer_quality-q{config.questions}-seed{config.seed}.jsonl"
    params = QualityTraceParams(questions=config.questions)
    header, requests = build_quality_trace(params, config.seed)
    write_trace(path, header, requests)
    return path


def rescore(config: QualityConfig, trace: list[TraceRequest]) -> dict[str, list[dict[str, Any]]]:
    """Each order's saved answers (`answers-<order>.jsonl`) scored again: the same
    answers, the current metrics."""
    by_order = {}
    for order in config.orders:
        lines = (config.out / f"answers-{order}.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        requests = [arranged_request(r, order) for r in trace]
        if [r["rid"] for r in records] != [r.rid for r in requests]:
            raise ValueError(f"answers-{order}.jsonl does not answer this trace")
        by_order[order] = score(requests, records, order)
    return by_order


def run(config: QualityConfig, command: str, rescore_only: bool = False) -> dict[str, Any]:
    config.out.mkdir(parents=True, exist_ok=True)
    trace = read_trace(ensure_trace(config)).requests
    measured_by = command
    if rescore_only:
        by_order = rescore(config, trace)
        with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
            saved = json.loads((config.out / "summary.json").read_text())
            measured_by = saved.get("measured_by") or saved["command"]
    else:
        tokenizer = model_directory(config)
        by_order = {}
        for order in config.orders:
            by_order[order] = run_order(config, order, trace, tokenizer)
    for order, rows in by_order.items():
        with (config.out / f"answers-{order}.jsonl").open("w") as handle:
            for row in rows:
                handle.write(json.dumps(row) + "\n")
    summary = summarize(by_order)
    result = {
        "measured_by": measured_by,
        "command": command,
        "config": {
            **asdict(config),
            "out": str(config.out),
            "trace": str(config.trace) if config.trace else None,
        },
        "summary": summary,
    }
    (config.out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    header = f"`{measured_by}`" + (f" (scored by `{command}`)" if command != measured_by else "")
    (config.out / "report.md").write_text(f"{header}\n\n{report_table(summary)}\n")
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prism-loadgen quality", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--engine", choices=("sglang-cpu", "sim"), default="sglang-cpu")
    parser.add_argument("--model", choices=("smollm2",), default="smollm2")
    parser.add_argument(
        "--orders",
        default=",".join(DEFAULT_ORDERS),
        help=f"comma-separated, among {', '.join(ORDERS)}",
    )
    parser.add_argument("--questions", type=int, default=240)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace", type=Path, default=None, help="an answer_quality trace")
    parser.add_argument("--qas", default="full", help="the prism order's QAS variant")
    parser.add_argument("--sglang-python", default=SGLANG_PYTHON)
    parser.add_argument(
        "--layout",
        choices=CHAT_LAYOUTS,
        default=None,
        help="an unmodified client: no hints, the passages in this chat layout",
    )
    parser.add_argument(
        "--rescore", action="store_true", help="score the answers saved in --out again, ask nothing"
    )
    return parser


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = QualityConfig(
            out=args.out,
            engine=args.engine,
            model=args.model,
            orders=tuple(o for o in args.orders.split(",") if o),
            questions=args.questions,
            concurrency=args.concurrency,
            seed=args.seed,
            trace=args.trace,
            sglang_python=args.sglang_python,
            qas=args.qas,
            layout=args.layout,
        )
    except ValueError as exc:
        print(f"prism-loadgen quality: {exc}", file=sys.stderr)
        return 2
    if (
        config.engine == "sglang-cpu"
        and not args.rescore
        and not Path(config.sglang_python).exists()
    ):
        print(
            f"prism-loadgen quality: {config.sglang_python} missing: run `make sglang-venv`",
            file=sys.stderr,
        )
        return 2
    result = run(config, "prism-loadgen quality " + " ".join(argv), rescore_only=args.rescore)
    print(report_table(result["summary"]))
    return 0
