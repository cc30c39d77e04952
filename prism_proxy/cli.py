"""`prism-proxy`: `serve` (the admission proxy) and `explain` (one QAS round as JSON)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from prism_proxy.config import ConfigError
from prism_proxy.config_sources import add_arguments, build_config


def _serve(args: argparse.Namespace) -> int:
    settings = {k: v for k, v in vars(args).items() if k != "command"}
    from prism_proxy.edge.accounts import load_keys

    try:
        config = build_config(settings)
        load_keys(config)  # a bad key file stops the start here, as a bad setting does
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    from prism_proxy.edge.tracing import configure_access_log, install_log_context

    install_log_context()  # every record names its request (or "-")
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s",
    )
    configure_access_log(config.access_log)
    import asyncio

    import uvloop

    from prism_proxy.app import serve
    from prism_proxy.memory import limit_arenas

    limit_arenas()  # before any thread: see prism_proxy.memory

    logging.getLogger(__name__).info(
        "prism-proxy on %s:%d → %s (policy %s, prefill batch %s, max in flight %s,"
        " window %.1f ms)",
        config.host, config.port, config.backend_url, config.policy,
        config.prefill_batch or "auto", config.max_inflight or "auto", config.window_ms,
    )  # fmt: skip
    try:
        uvloop.run(serve(config))
    except RuntimeError as exc:  # a resource failed to start (e.g. --tokenizer auto)
        sys.stderr.write(f"error: {exc}\n")
        return 1
    except asyncio.CancelledError:  # a second SIGTERM/SIGINT cut the drain short
        return 1
    return 0


def _explain(args: argparse.Namespace) -> int:
    from prism_proxy import explain

    return explain.main(args.file)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prism-proxy", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the admission proxy",
        description="Settings: command line (a flag or --set) > PRISM_* environment variable > "
        "--config file > default.",
        # No abbreviations: `--engine-api-key K` must not pass as `--engine-api-key-file K`.
        allow_abbrev=False,
    )
    add_arguments(serve)
    serve.set_defaults(handler=_serve)
    explain = commands.add_parser("explain", help="print what one QAS round would do")
    explain.add_argument("file", nargs="?", default=None, help="JSON input (default: stdin)")
    explain.set_defaults(handler=_explain)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = args.handler
    del args.handler
    return int(handler(args))


if __name__ == "__main__":
    sys.exit(main())
