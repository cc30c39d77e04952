"""The engine a proxy benchmark runs against, and the proxy's start-up arguments.

`sglang` is the real, unmodified SGLang 0.5.23 on this CPU (the tiny random-weight
model, a 16k-token pool, incremental streams as deployed), started with
`sglang_python`; `sim` is prism-sim at its defaults.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from loadgen.stack.processes import ServerProcess, engine_args, run_server
from loadgen.stack.processes import proxy_args as launch_proxy


@contextlib.contextmanager
def engine(kind: str, log_dir: Path, sglang_python: str) -> Iterator[ServerProcess]:
    if kind == "sglang":
        args = engine_args({"model": "tiny", "max_total_tokens": 16384, "eviction": "stock",
                            "sglang": {"incremental_streaming_output": True}})  # fmt: skip
        with run_server("sglang_cpu.serve", args, log_dir=log_dir, name="sglang",
                        python=sglang_python, startup_timeout_s=900.0) as server:  # fmt: skip
            yield server
    else:
        with run_server(
            "prism_sim", engine_args({"log_level": "warning"}), log_dir=log_dir
        ) as server:
            yield server


def proxy_args(kind: str, backend_url: str, settings: Mapping[str, Any] | None = None) -> list[str]:
    """`prism-proxy serve` in front of `backend_url` at its defaults but `settings`;
    prism-sim tokenizes with `builtin`, SGLang's model directory is local here (`auto`
    finds it; an older checkout's `auto` reads it from the engine too)."""
    tokenizer = "builtin" if kind == "sim" else "auto"
    defaults = {"backend": backend_url, "tokenizer": tokenizer, "log_level": "warning"}
    return launch_proxy({**defaults, **(settings or {})})
