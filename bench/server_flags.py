"""Which files spell a server's flags (issue 38: one launcher alone should).

    python -m bench.server_flags

A file spells a flag when one of its string literals starts with a flag of the proxy
(`prism_proxy.options`, with `--set` and `--config`), of prism-sim or of
`sglang_cpu.serve` (their own argument parsers). Left out: the tests, the servers' own
packages, this file, and a file's own `add_argument` calls (its options, not a server's). A flag
shared with a file's own command line (`--seed` of a command that runs itself) counts
too: read the list, not only the number. Prints each file with the flags it spells,
then the count.

The one file it should list is the launcher, `loadgen/stack/processes.py` (`--port`,
`--set`, `--sglang-arg`). Two limits to read it with:

* The peers' own flags (smg's and sglang-router's `--worker-urls`, ContextPilot's
  `--infer-api-url`) are not in the set: their parsers are not importable here. Only
  the flags they share with our servers (`--host`, `--log-level`, `--policy`, `--port`)
  would show a peer's command line spelled outside the launcher (`peer_args`).
* `prism-loadgen sweep` has options of its own spelled like the proxy's (`--set`,
  `--backend`); its error messages name those as settings ("sweep setting
  client_api=...", "backend sglang-cpu"), so they do not count as a server's flag.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
from pathlib import Path

import prism_sim.cli
import sglang_cpu.serve
from prism_proxy.options import options

ROOT = Path(__file__).resolve().parent.parent
OWN_PACKAGES = ("tests/", "prism_proxy/", "prism_sim/", "sglang_cpu/", "backend_plugin/")
THIS_FILE = "bench/server_flags.py"  # names the flags it looks for


def server_flags() -> set[str]:
    """Every flag of the proxy, prism-sim and `sglang_cpu.serve`, `--help` aside."""
    flags = {option.flag for option in options()} | {"--set", "--config"}
    for parser in (prism_sim.cli.build_parser(), sglang_cpu.serve.build_parser()):
        flags |= {s for a in parser._actions for s in a.option_strings if s.startswith("--")}
    return flags - {"--help"}


def spelled(source: str, flags: set[str]) -> set[str]:
    """The flags among `flags` that `source`'s string literals start with, outside its
    own `add_argument` calls."""
    tree = ast.parse(source)
    own = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"
        for inner in ast.walk(node)
    }
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in own:
            head = node.value.split("=")[0].split(" ")[0]
            if head in flags:
                found.add(head)
    return found


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    flags = server_flags()
    count = 0
    for path in sorted(p for p in tracked if not p.startswith(OWN_PACKAGES) and p != THIS_FILE):
        found = spelled((ROOT / path).read_text(), flags)
        if found:
            count += 1
            print(f"{path}: {' '.join(sorted(found))}")
    print(f"{count} files outside tests spell a server's flag")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
