"""`python -m backend_plugin.launch <sglang args>`: SGLang with DART selected.

It only sets flags and environment, then runs SGLang's own `sglang.launch_server`
entry point unchanged. Adds `--radix-cache-backend prism_dart` unless given, and maps
its own options to the environment the scheduler processes inherit:

    --prism-control-port N    → PRISM_CONTROL_PORT   (dp rank r listens on N + r)
    --prism-control-token T   → PRISM_CONTROL_TOKEN
    --prism-control-host H    → PRISM_CONTROL_HOST
    --prism-policy P          → PRISM_DART_POLICY   (dart | lru | lru+active | lfu)
    --prism-protect F         → PRISM_DART_PROTECT
    --prism-protect-fraction X → PRISM_DART_PROTECT_FRACTION
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import MutableMapping, Sequence

_ENV_FLAGS = {
    "--prism-control-port": "PRISM_CONTROL_PORT",
    "--prism-control-token": "PRISM_CONTROL_TOKEN",
    "--prism-control-host": "PRISM_CONTROL_HOST",
    "--prism-policy": "PRISM_DART_POLICY",
    "--prism-protect": "PRISM_DART_PROTECT",
    "--prism-protect-fraction": "PRISM_DART_PROTECT_FRACTION",
}


def build_argv(argv: Sequence[str], env: MutableMapping[str, str]) -> list[str]:
    """SGLang's argv (our options moved into `env`), with the DART backend selected."""
    out: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name in _ENV_FLAGS:
            if not eq:
                if i + 1 >= len(args):
                    raise SystemExit(f"{name} needs a value")
                i += 1
                value = args[i]
            env[_ENV_FLAGS[name]] = value
        else:
            out.append(args[i])
        i += 1
    if not any(a.split("=")[0] == "--radix-cache-backend" for a in out):
        out += ["--radix-cache-backend", "prism_dart"]
    return out


def main(argv: Sequence[str] | None = None) -> None:
    sglang_argv = build_argv(sys.argv[1:] if argv is None else argv, os.environ)
    sys.argv = ["sglang.launch_server", *sglang_argv]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
