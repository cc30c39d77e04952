"""How many options `prism-loadgen` has (issue 38: at most 90).

    python -m bench.loadgen_options

Walks the parser tree `loadgen.cli` builds (every subcommand, nested ones such as
`trace rag` included) plus the two subcommands that parse their own arguments,
`quality` (`loadgen.quality.run.build_parser`) and `scale-out`
(`loadgen.experiments.scale_out.build_parser`). Counts every option string of every
subcommand (`--policies`, and each of an option's spellings), `-h/--help` left out; an
option shared by two subcommands counts once in each. Prints each subcommand's options,
then the total.
"""

from __future__ import annotations

import argparse

from loadgen.cli import OWN_PARSERS, build_parser

HELP = frozenset({"-h", "--help"})


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """A parser's own option strings, in the order they were added, help left out."""
    return [s for a in parser._actions for s in a.option_strings if s not in HELP]


def subcommands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, list[str]]:
    """Each leaf subcommand's options (a parser's options go to each of its leaves),
    keyed by its path (`trace rag`)."""
    own = option_strings(parser)
    found: dict[str, list[str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                path = f"{prefix} {name}".strip()
                for leaf, options in subcommands(child, path).items():
                    found[leaf] = own + options
    return found or {prefix: own}


def measure() -> dict[str, list[str]]:
    """Every subcommand of `prism-loadgen` with its option strings; the subcommands
    with their own parsers measured through them."""
    tree = subcommands(build_parser())
    for name, build in OWN_PARSERS.items():
        tree[name] = option_strings(build())
    return tree


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    tree = measure()
    for name, options in tree.items():
        print(f"{name} ({len(options)}): {' '.join(options)}")
    print(f"{sum(map(len, tree.values()))} options in prism-loadgen")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
