"""Time per MB of `prism_proxy.prompts.extraction.extract` (all layouts, the defaults) on normal
RAG prompts and on bad input.

    python -m bench.extraction [--mb 1.0] [--repeats 5]

Each input is built at about `--mb` megabytes; the best of `--repeats` runs is printed
as milliseconds per MB, with the layout found (or None). A finder that did more than
linear work would show up as one adversarial row far above the normal rows, and as a
growing ms/MB when `--mb` grows. No thresholds: it prints numbers.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from prism_proxy.prompts.extraction import extract

PARAGRAPH = (
    "The river runs past the old mill and the children count the boats that pass. "
    "Each boat carries grain from the valley to the town market on the coast.\n"
)


def _repeat(unit: str, size: int) -> str:
    return unit * max(1, size // len(unit))


def _docs(size: int, count: int = 200) -> list[str]:
    per_doc = max(1, size // count // len(PARAGRAPH))
    return [f"Passage {i}. " + PARAGRAPH * per_doc for i in range(count)]


def normal_inputs(size: int) -> dict[str, str]:
    docs = _docs(size)
    question = "Question: where does the grain go?\nAnswer:"
    return {
        "normal xml": "<documents>\n"
        + "".join(f'<document index="{i}">\n{d}</document>\n' for i, d in enumerate(docs))
        + "</documents>\n\n"
        + question,
        "normal numbered": "".join(f"[{i}] {d}" for i, d in enumerate(docs, 1)) + "\n" + question,
        "normal markdown": "".join(f"## Source {i}\n{d}\n" for i, d in enumerate(docs)) + question,
        "normal dashed": "Context information is below.\n---------------------\n"
        + "\n".join(docs)
        + "---------------------\nGiven the context information, answer.\n"
        + question,
        "normal blank": "Use the following pieces of context.\n\n"
        + "\n".join(docs)
        + "\n"
        + question,
    }


def adversarial_inputs(size: int) -> dict[str, str]:
    markers = size // 8
    return {
        "consecutive [n] markers": "".join(f"[{i}] x\n" for i in range(1, markers)),
        "colliding [1] markers": _repeat("[1] x\n", size),
        "'1. ' lines": _repeat("1. x\n", size),
        "markdown headers": _repeat("## h\nx\n", size),
        "code fences": _repeat("```\n## h\n", size),
        "blank lines": "\n" * size,
        "blank lines with spaces": _repeat(" \n", size),
        "blank-line blocks": _repeat("x\n\n", size),
        "blocks in a dashed frame": "---\n" + _repeat("x\n\n", size) + "---\nQ",
        "rule lines": _repeat("---\n", size),
        "one long rule line": "-" * size + "x\n",
        "nested <doc>": _repeat("<doc>", size // 2) + "x" + _repeat("</doc>", size // 2),
        "interleaved nested tags": _repeat("<doc><source>", size // 2)
        + _repeat("</source></doc>", size // 2),
        "unclosed <doc>": _repeat("<doc>x\n", size),
        "stray </doc>": _repeat("</doc>\n", size),
        "xml documents past max": _repeat("<doc>x</doc>\n", size) + "\nQ",
        "'<' only": "<" * size,
        "unterminated attribute": "<doc " + "a" * size,
        "spaces after a newline": "\n" + " " * size + "x",
        "'#' only": "#" * size,
        "'[' only": "[" * size,
        "markers quoted mid-line": "".join(
            f"[{i}] cites [{i + 1}] and [1] {'z' * (size // 256)}\n" for i in range(1, 257)
        )
        + "\nQ",
    }


def best_seconds(run: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=1.0, help="size of each input")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    size = int(args.mb * (1 << 20))
    print(f"{'input':32} {'MB':>6} {'found':>14} {'ms/MB':>8}")
    for group in (normal_inputs(size), adversarial_inputs(size)):
        for name, text in group.items():
            found = extract(text)
            result = "None" if found is None else f"{found.layout}:{len(found.documents)}"
            seconds = best_seconds(lambda text=text: extract(text), args.repeats)
            megabytes = len(text) / (1 << 20)
            print(f"{name:32} {megabytes:6.2f} {result:>14} {seconds * 1e3 / megabytes:8.1f}")
        print()


if __name__ == "__main__":
    main()
