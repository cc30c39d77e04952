"""What cutting a chat at its message ends costs (`prism_proxy.prompts.conversation.find_turns`),
beside rendering and tokenizing it once, for agent histories of growing length.

    python -m bench.turns [--repeats 20]

Each history is a system message, a task, then tool calls and tool results (8 tools in
the request), as an agent loop sends it; the builtin tokenizer and its template. Prints
the best of `--repeats` runs of each, in milliseconds, and their ratio. No thresholds.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from prism_proxy.prompts.conversation import find_turns
from prism_tokens.chat import content_format, template_messages, template_tools
from prism_tokens.tokenizer import load_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool{i}",
            "description": "Looks something up. " * 10,
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
    for i in range(8)
]


def history(calls: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent. Use the tools. " * 20},
        {"role": "user", "content": "Find out about the river and its bridges. " * 10},
    ]
    for i in range(calls):
        call = {"name": "tool1", "arguments": json.dumps({"query": f"bridge {i}"})}
        messages.append(
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": f"call_{i}", "type": "function", "function": call}]}
        )  # fmt: skip
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": "A result. " * 60})
    messages.append({"role": "user", "content": "Go on."})
    return messages


def best_ms(work: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best * 1000.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.turns")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer()
    fmt = content_format(tokenizer.chat_template)
    tools = template_tools(TOOLS, None)
    print("| messages | tokens | cuts | find_turns | render + encode once | ratio |")
    print("|---|---|---|---|---|---|")
    for calls in (1, 10, 50, 200):
        given = template_messages(history(calls), fmt)
        turns = find_turns(tokenizer, given, tools)  # warms the chat pieces' cache

        def once(given: list[dict[str, Any]] = given) -> object:
            return tokenizer.encode_chat(tokenizer.render_chat(given, True, tools))

        cut = best_ms(lambda given=given: find_turns(tokenizer, given, tools), args.repeats)
        plain = best_ms(once, args.repeats)
        print(
            f"| {len(given)} | {len(turns.ids)} | {len(turns.cuts)} | {cut:.2f} ms "
            f"| {plain:.2f} ms | {cut / plain:.1f}× |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
