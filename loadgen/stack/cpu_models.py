"""The CPU server's models in the sweep harness (`--set model=tiny|smollm2`).

`tiny` (the default) is the random-weight model of `sglang_cpu.model`,
whose tokenizer is the proxy's builtin one. `smollm2` is SmolLM2-135M-Instruct
(`sglang_cpu.smollm2`): the trace, the proxy and the twin must then
tokenize with the model's own directory, prepared on first use by the SGLang
environment (it needs torch and transformers).

KV pool. SGLang on CPU sizes the pool as min(`--max-total-tokens`,
`mem_fraction_static` · available memory − weights); at serve.py's 0.05 and ~20 GB
free that is ~37,000 SmolLM2 tokens (23,040 B each: 2 · 30 layers · 3 KV heads · 64 ·
2 B), below any `--max-total-tokens` asked for, and it moves with free memory. So
`smollm2` raises `mem_fraction_static` to 0.3 and asks for 131,072 tokens (3.0 GB):
more than a few-hundred-request zipf_hotspot trace's prompt and output tokens
together (a 120-request trace holds ~94,000), so nothing is evicted and a twin-vs-real
comparison checks the time model, not the eviction order.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class CpuModel:
    name: str
    kv_tokens: int  # default --max-total-tokens of the sweep's servers
    # SGLang's own settings for this model (`engine_args`' `sglang` key)
    sglang: dict[str, Any] = field(default_factory=dict)

    def directory(self, sglang_python: str) -> Path | None:
        """The model directory (prepared first if absent), or None for `tiny`, whose
        tokenizer is the proxy's builtin one."""
        if self.name == "tiny":
            return None
        from sglang_cpu.smollm2 import smollm2_dir

        path = smollm2_dir()
        if (path / "tokenizer.json").exists():
            return path
        done = subprocess.run(
            [sglang_python, "-m", "sglang_cpu.smollm2"],
            check=True,
            capture_output=True,
            text=True,
        )
        return Path(done.stdout.strip().splitlines()[-1])


CPU_MODELS = {
    "tiny": CpuModel("tiny", 65536),  # ~256 B/token: room for any trace here
    "smollm2": CpuModel("smollm2", 131072, {"mem_fraction_static": 0.3}),
}
