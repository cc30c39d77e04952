"""What an engine's info answers reveal that a client of the proxy must not read, found
by a rule over the engine's own answers (not a list of known fields):

* a field whose name has a credential, address or path word (`admin_api_key`, `host`,
  `port`, `model_path`, `download_dir`, `otlp_traces_endpoint`, `launch_command`, ...),
  at any depth: its string values that look like a secret or a location (a credential
  field's value, or one with `/`, `\\`, `:` or `.` in it: paths, URLs, addresses; plain
  words such as `cache` are settings, not locations), and its integer values when the
  field is a port;
* in a proxied answer, such a value anywhere in the text (`:PORT` for ports), and any
  field that is revealing by the same rule.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

_WORDS = (
    "key", "keys", "token", "secret", "password", "host", "port", "path", "paths", "dir",
    "folder", "file", "keyfile", "certfile", "certs", "socket", "addr", "address", "endpoint",
    "endpoints", "url", "urls", "uri", "ip", "domains", "command",
)  # fmt: skip
SENSITIVE_NAME = re.compile(rf"(?:^|_)(?:{'|'.join(_WORDS)})(?:_|$)")
_CREDENTIAL = re.compile(r"(?:^|_)(?:key|token|secret|password)(?:_|$)")
_PORT = re.compile(r"(?:^|_)port(?:_|$)")
_LOCATION = re.compile(r"[/\\:.]")


def revealing(key: str, value: Any) -> bool:
    """Whether a field's value is a secret, a location or a port by the rule above
    (`token_capacity: 4096` is a count, not a credential)."""
    if not SENSITIVE_NAME.search(key):
        return False
    if isinstance(value, str) and value:
        return bool(_CREDENTIAL.search(key) or _LOCATION.search(value))
    return isinstance(value, int) and not isinstance(value, bool) and bool(_PORT.search(key))


def leaves(value: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """(the name of the field holding it, value) for every scalar in a JSON value."""
    if isinstance(value, dict):
        for name, item in value.items():
            yield from leaves(item, str(name))
    elif isinstance(value, list):
        for item in value:
            yield from leaves(item, key)
    else:
        yield key, value


@dataclass
class Secrets:
    """What must not reach a client: strings and port numbers."""

    strings: set[str] = field(default_factory=set)
    ports: set[int] = field(default_factory=set)

    def add_answer(self, answer: Any) -> None:
        for key, value in leaves(answer):
            if revealing(key, value):
                (self.strings if isinstance(value, str) else self.ports).add(value)

    def leaks(self, text: str) -> list[str]:
        """What of it `text` (a proxied answer) shows; [] when nothing."""
        found = sorted(s for s in self.strings if s in text)
        found += [f":{port}" for port in sorted(self.ports) if f":{port}" in text]
        try:
            answer = json.loads(text)
        except ValueError:
            return found
        found += [f"field {key!r}" for key, value in leaves(answer) if revealing(key, value)]
        return found
