"""Tokenizing multi-turn chats: whole texts against cached pieces, side by side.

    python -m bench.chat_tokens [--requests 400] [--conversations 8] [--tokenizer DIR]

Renders every request of `bench.agent_chats` (agents re-sending their whole history each
turn) with the tokenizer's chat template, then tokenizes it both ways, one right after
the other: `Tokenizer.encode` (the whole text, as the proxy did) and
`Tokenizer.encode_chat` (the pieces between special tokens, cached across requests:
`prism_tokens.chat_pieces`). It checks the ids are equal and prints the CPU time per
request of each and their ratio.
"""

from __future__ import annotations

import argparse
import time

from bench.agent_chats import agent_turns
from prism_tokens.tokenizer import load_tokenizer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--tokenizer", default="builtin", help="builtin, or a model directory")
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer(args.tokenizer)
    if tokenizer.chat_pieces is None:
        raise SystemExit(f"{tokenizer.name}: pieces cannot be cut outside the library here")
    requests = agent_turns(tokenizer, args.requests, conversations=args.conversations)
    whole_s = pieces_s = 0.0
    chars = tokens = 0
    for messages in requests:
        text = tokenizer.render_chat(messages)
        started = time.process_time()
        whole = tokenizer.encode(text)
        between = time.process_time()
        pieces = tokenizer.encode_chat(text)
        ended = time.process_time()
        if pieces != whole:
            raise SystemExit(f"ids differ for a request of {len(text)} characters")
        whole_s += between - started
        pieces_s += ended - between
        chars += len(text)
        tokens += len(whole)
    n = len(requests)
    info = tokenizer.chat_pieces.info()
    print(
        f"{n} requests of {args.conversations} interleaved agents, tokenizer {tokenizer.name}: "
        f"{chars / n:,.0f} characters, {tokens / n:,.0f} tokens per request on average"
    )
    print()
    print("| tokenized | CPU ms per request | µs per 1k tokens |")
    print("|---|---|---|")
    rows = (("whole text (encode)", whole_s), ("cached pieces (encode_chat)", pieces_s))
    for name, seconds in rows:
        print(f"| {name} | {seconds / n * 1e3:.3f} | {seconds / tokens * 1e9:.1f} |")
    print()
    hit_rate = info["hits"] / max(1, info["hits"] + info["misses"])
    print(
        f"cached pieces / whole text: {pieces_s / whole_s:.3f}; same ids for all {n} requests; "
        f"piece hit rate {hit_rate:.1%}, {info['entries']} pieces held "
        f"({info['bytes'] / 2**20:.1f} MiB)"
    )


if __name__ == "__main__":
    main()
