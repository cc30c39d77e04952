"""`python -m backend_plugin.launch <sglang args>`: SGLang with DART selected.

It only sets flags and environment, then runs SGLang's own `sglang.launch_server`
entry point unchanged. Adds `--radix-cache-backend prism_dart` unless given, and maps
its own options to the environment the scheduler processes inherit:

    --prism-control-port N    → PRISM_CONTROL_PORT   (dp rank r listens on N + r)
    --prism-control-token-file F → PRISM_CONTROL_TOKEN_FILE (a file holding the token)
    --prism-control-host H    → PRISM_CONTROL_HOST
    --prism-policy P          → PRISM_DART_POLICY   (dart | lru | lru+active | lfu)
    --prism-protect F         → PRISM_DART_PROTECT
    --prism-protect-fraction X → PRISM_DART_PROTECT_FRACTION

Secrets never travel on a command line, which every local user can read in
`/proc/<pid>/cmdline`: the control token comes from PRISM_CONTROL_TOKEN or a file
(`--prism-control-token <token>` is refused), and SGLang's own `--api-key` and
`--admin-api-key` from the environment, added to SGLang's argv inside this process only
(the kernel's copy of the command line stays as it was):

    PRISM_ENGINE_API_KEY[_FILE]        → --api-key        (every API call needs it)
    PRISM_ENGINE_ADMIN_API_KEY[_FILE]  → --admin-api-key  (cache flush, weights, profile)

Giving either of those two flags on the command line is refused as well.

SGLang flags a deployment adds without editing its command come from the environment:

    PRISM_SGLANG_EXTRA_ARGS            → appended to the command line, split as a shell
                                         would (e.g. `--enable-hierarchical-cache
                                         --hicache-ratio 2`; docs/deploy.md)

They go through the same rules as the command line: our options are moved into the
environment and the secret flags are refused.
"""

from __future__ import annotations

import os
import runpy
import shlex
import sys
from collections.abc import MutableMapping, Sequence

from prism_wire.secret import SecretError, read_secret

_ENV_FLAGS = {
    "--prism-control-port": "PRISM_CONTROL_PORT",
    "--prism-control-token-file": "PRISM_CONTROL_TOKEN_FILE",
    "--prism-control-host": "PRISM_CONTROL_HOST",
    "--prism-policy": "PRISM_DART_POLICY",
    "--prism-protect": "PRISM_DART_PROTECT",
    "--prism-protect-fraction": "PRISM_DART_PROTECT_FRACTION",
}


# SGLang's key flags, each from an environment variable (or the file `<variable>_FILE`
# names), never from the command line.
_KEY_FLAGS = {
    "--api-key": "PRISM_ENGINE_API_KEY",
    "--admin-api-key": "PRISM_ENGINE_ADMIN_API_KEY",
}
# SGLang flags from the environment, after the command line's.
EXTRA_ARGS = "PRISM_SGLANG_EXTRA_ARGS"
# Flags whose value would be a secret on the command line, and where it goes instead.
_REFUSED = {
    "--prism-control-token": "PRISM_CONTROL_TOKEN or --prism-control-token-file",
    **{flag: f"{name} or {name}_FILE" for flag, name in _KEY_FLAGS.items()},
}


def build_argv(argv: Sequence[str], env: MutableMapping[str, str]) -> list[str]:
    """SGLang's argv (our options moved into `env`, the engine's keys added from it),
    with the DART backend selected."""
    out: list[str] = []
    try:
        extra = shlex.split(env.get(EXTRA_ARGS, ""))
    except ValueError as exc:  # an unclosed quote: stop before SGLang starts
        raise SystemExit(f"{EXTRA_ARGS}: {exc}") from None
    args = [*argv, *extra]
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name in _REFUSED:
            raise SystemExit(
                f"{name}: a secret is never given on the command line (every local user can "
                f"read it); use {_REFUSED[name]}"
            )
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
    for flag, name in _KEY_FLAGS.items():
        try:
            key = read_secret(env, name)
        except SecretError as exc:  # an unusable *_FILE: stop before SGLang starts
            raise SystemExit(str(exc)) from None
        if key is not None:
            out += [flag, key]
    return out


def main(argv: Sequence[str] | None = None) -> None:
    sglang_argv = build_argv(sys.argv[1:] if argv is None else argv, os.environ)
    sys.argv = ["sglang.launch_server", *sglang_argv]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
