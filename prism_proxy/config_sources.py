"""Where settings come from, merged into a `ProxyConfig` (`build_config`): the command
line (the flags of `options.FLAGS`, `--set KEY=VALUE`, `--config`), `PRISM_*` environment
variables, and a TOML or JSON config file (`--config` / `PRISM_CONFIG`).

Precedence: command line > environment > file > default. Secrets come from the
environment, the file or a `*_file` setting naming a file, never from the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from prism_proxy.config import AUTOMATIC, ConfigError, ProxyConfig
from prism_proxy.options import ENV_PREFIX, FLAGS, SECRET_FILES, SECRETS, Option, options
from prism_proxy.qas.params import DEFAULT_QAS_VARIANT, QAS_VARIANTS, qas_params
from prism_wire.secret import SecretError, read_secret


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `FLAGS`, `--config` and `--set`; unset flags stay absent (SUPPRESS)
    for precedence."""
    parser.add_argument("--config", default=argparse.SUPPRESS, help="TOML or JSON config file")
    for option in options():
        if option.name not in FLAGS:
            continue
        default = option.default
        if default is None:
            default = "auto" if option.name in AUTOMATIC else "unset"
        parser.add_argument(
            option.flag,
            dest=option.name,
            type=option.parse,
            default=argparse.SUPPRESS,
            help=f"{option.help} (default {default})",
        )
    parser.add_argument(
        "--set",
        dest="set",
        action="append",
        metavar="KEY=VALUE",
        default=argparse.SUPPRESS,
        help="any other setting, by its config file key (repeatable; docs/proxy.md lists "
        "them all, with their PRISM_* variables)",
    )


def _set_values(pairs: Sequence[str]) -> dict[str, Any]:
    """`--set KEY=VALUE` pairs as settings, each parsed like its environment variable."""
    known = {option.key: option for option in options()}
    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip().replace("-", "_")
        option = known.get(key)
        if not sep or option is None:
            raise ConfigError(f"--set {pair!r}: expected KEY=VALUE with a setting's key")
        if option.name in SECRETS:
            raise ConfigError(
                f"--set {key}: a secret is never given on the command line (readable by "
                f"every local user): set {option.env} or {option.env}_FILE"
            )
        values[option.name] = _coerce(option, text, "--set")
    return values


def _read_secrets(values: dict[str, Any]) -> None:
    """Fill `control_token` and `engine_api_key` from their `*_file` settings (the file's
    text without surrounding whitespace); a secret given both ways is an error."""
    for name in SECRET_FILES:
        if values.get(f"{name}_file") is None:
            continue  # no file: a direct value stays as given, for `ProxyConfig` to check
        try:
            values[name] = read_secret(values, name, file_suffix="_file")
        except SecretError as exc:
            raise ConfigError(str(exc)) from None


def load_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML (`.toml`) or JSON config file into a flat mapping of settings.

    Keys use the flag names with `_` or `-` (`max_inflight`, `max-inflight`); QAS
    parameters may also sit in a `[qas]` table.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"config: cannot read {path}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"config: cannot parse {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path} must hold a table/object")
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key == "qas" and isinstance(value, str):
            flat["qas_variant"] = value
        elif key == "qas" and isinstance(value, dict):
            flat.update({k.replace("-", "_"): v for k, v in value.items()})
        else:
            flat[key.replace("-", "_")] = value
    return flat


def _coerce(option: Option, value: Any, source: str) -> Any:
    """Parse a string (env) or check a typed value (file)."""
    try:
        if isinstance(value, str):
            return option.parse(value)
        if value is None:
            return None
        if isinstance(value, bool) and option.parse in (int, float):
            raise TypeError("boolean")
        return option.parse(str(value)) if option.parse in (int, float) else value
    except (TypeError, ValueError):
        raise ConfigError(f"{option.name} (from {source}): bad value {value!r}") from None


def build_config(
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ProxyConfig:
    """Merge flags > environment > config file > defaults into a `ProxyConfig`."""
    flags = dict(flags or {})
    environ = os.environ if environ is None else environ
    config_path = flags.pop("config", None) or environ.get(ENV_PREFIX + "CONFIG")
    flags = {**_set_values(flags.pop("set", None) or []), **flags}
    file_values = load_file(config_path) if config_path else {}
    known = {option.name: option for option in options()}
    unknown = sorted(set(file_values) - set(known))
    if unknown:
        raise ConfigError(f"config: unknown setting(s) {', '.join(unknown)}")

    values: dict[str, Any] = {}
    for name, option in known.items():
        if name in flags:
            values[name] = flags[name]
        elif option.env in environ:
            values[name] = _coerce(option, environ[option.env], option.env)
        elif name in file_values:
            values[name] = _coerce(option, file_values[name], f"config {config_path}")
    _read_secrets(values)
    qas_values = {k: v for k, v in values.items() if known[k].qas}
    proxy_values = {k: v for k, v in values.items() if not known[k].qas}
    try:
        variant = proxy_values.get("qas_variant", DEFAULT_QAS_VARIANT)
        if variant not in QAS_VARIANTS:
            raise ConfigError(
                f"qas: unknown variant {variant!r}; choose one of {tuple(QAS_VARIANTS)}"
            )
        qas = qas_params(variant, qas_values)
        return replace(ProxyConfig(), qas=qas, **proxy_values)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def parse_serve_args(
    argv: Sequence[str] | None, environ: Mapping[str, str] | None = None
) -> ProxyConfig:
    """Parse `serve` flags alone (used by tests and by `cli.py`)."""
    parser = argparse.ArgumentParser(prog="prism-proxy serve", allow_abbrev=False)
    add_arguments(parser)
    return build_config(vars(parser.parse_args(argv)), environ)
