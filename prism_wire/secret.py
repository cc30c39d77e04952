"""Reading a secret given directly or in a file: the DART control RPC's bearer token and
the engine's API keys, read the same way by the proxy, the simulated engine, the SGLang
launcher and the plugin.

A secret never comes from a command line (every local user can read
`/proc/<pid>/cmdline`): it is a setting `NAME` (an environment variable, a config-file
key), or a setting `NAME_FILE` naming a file that holds it (a container secret, a
tmpfs file). Each caller turns `SecretError` into its own kind of error.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


class SecretError(ValueError):
    """A secret setting that cannot be used; the message names the setting."""


def read_secret(settings: Mapping[str, Any], name: str, file_suffix: str = "_FILE") -> str | None:
    """The secret `settings[name]`, else the text (without surrounding whitespace) of the
    file `settings[name + file_suffix]` names, else None.

    An empty value counts as not given (`NAME=` in an environment). Raises `SecretError`
    when both are given (which one was meant is unknown), when the file cannot be read,
    and when it holds only whitespace (an empty secret would turn authentication off).
    """
    value = settings.get(name) or None
    path = settings.get(name + file_suffix) or None
    if path is None:
        return value
    file_setting = name + file_suffix
    if value is not None:
        raise SecretError(f"{name}: given both directly and as {file_setting}; give one")
    try:
        text = Path(path).read_text().strip()
    except OSError as exc:
        raise SecretError(f"{file_setting}: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SecretError(f"{file_setting}: {path} is not UTF-8 text") from None
    if not text:
        raise SecretError(f"{file_setting}: {path} is empty")
    return text
