"""How far the proxy's piece-by-piece prompts are from the engine's own rendering of the
same chats, on the zipf_hotspot trace as unmodified clients send it.

    python -m bench.rendering_drift [--requests 300] [--tokenizers builtin,smollm2]

For each request of the sweep's trace (seed 0) and each chat layout of the load
generator (`blank`, `xml`, `numbered`, `markdown`, `dashed`), the chat goes through the
proxy's own job builder (`prompts.plan.text_chat`: the documents it finds, cut
and tokenized piece by piece) and through the template rendered whole and tokenized at
once (what SGLang does with `/v1/chat/completions`). Printed per tokenizer and layout:
the share of prompts whose ids differ, the mean and largest difference in length
(proxy minus engine), and the share of requests whose documents the proxy found. The
`smollm2` tokenizer is SmolLM2-135M-Instruct's (`make smollm2` prepares it); `builtin` is
the tiny CPU model's.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from loadgen.clients.apis import chat_messages
from loadgen.experiments.sweep import SweepConfig, ensure_trace
from loadgen.workloads.trace_format import read_trace
from prism_proxy.prompts.conversation import rendering_drift
from prism_proxy.prompts.evidence import BlockEvidence
from prism_proxy.prompts.extraction import ALL_LAYOUTS
from prism_proxy.prompts.plan import PlanContext, text_chat
from prism_proxy.prompts.serializer import Serializer
from prism_tokens.tokenizer import load_tokenizer

LAYOUTS = ("blank", "xml", "numbered", "markdown", "dashed")


def tokenizer_spec(name: str) -> str:
    if name == "smollm2":
        from sglang_cpu.smollm2 import smollm2_dir

        return str(smollm2_dir())
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--tokenizers", default="builtin,smollm2")
    args = parser.parse_args(argv)
    import tempfile
    from pathlib import Path

    config = SweepConfig(out=Path(tempfile.mkdtemp()), lines=(), qps=(40.0,),
                         num_requests=args.requests, seed=0)  # fmt: skip
    trace = read_trace(ensure_trace(config, 40.0))
    print(f"zipf_hotspot, {args.requests} requests, seed 0: the proxy's prompt vs the "
          "engine's rendering of the same chat")  # fmt: skip
    print("| tokenizer | layout | found | ids differ | mean length diff | largest |")
    print("|---|---|---|---|---|---|")
    for name in args.tokenizers.split(","):
        tokenizer = load_tokenizer(tokenizer_spec(name))
        for layout in LAYOUTS:
            serializer = Serializer(tokenizer, 64 << 20, 16 << 20)
            evidence = BlockEvidence(16 << 20).scoped("")
            differ, diffs, found = 0, [], 0
            for request in trace.requests:
                messages = chat_messages(request, layout)
                context = PlanContext(serializer, ALL_LAYOUTS, True, evidence)
                job = text_chat(messages, context)
                found += job.origin.startswith("found")
                ids = job.build(job.segments).prompt_fields["input_ids"]
                different, tokens = rendering_drift(tokenizer, messages, ids)
                differ += different
                diffs.append(tokens)
            n = len(trace.requests)
            print(f"| {name} | {layout} | {100 * found / n:.0f} % | {100 * differ / n:.0f} % | "
                  f"{statistics.fmean(diffs):+.2f} | {max(diffs, key=abs):+d} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
