"""The grammars a request makes the engine compile: JSON schemas (`response_format`,
`json_schema`, the tools of a constrained tool call) and the other grammars (`ebnf`,
`regex`, `structural_tag`), each with its size and the key the engine caches it under.

SGLang hands each to xgrammar's compiler, in a pool of min(32, CPUs + 4) threads that
every client shares, and keeps every compiled grammar in a dictionary that never
forgets: one grammar can take seconds to compile (a 58-byte pattern with nested
repetitions took 3 s on this CPU), and 200 distinct ~15 KB schemas grew the engine's
scheduler by 469 MB (issue 36). `edge.structured` bounds what one client may ask of it.

A grammar's key is its text as the engine receives it (a schema object serialized in
its own key order): the engine's cache matches exactly that text, so two schemas that
differ only in key order are two compilations there too. Pure functions over the
validated body.
"""

from __future__ import annotations

import hashlib
from collections.abc import Container, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class EngineGrammar:
    """One grammar a request asks the engine to compile."""

    param: str  # where it is in the body, for error messages
    text: str  # as the engine receives it (schemas serialized compactly)

    @property
    def size_bytes(self) -> int:
        return len(self.text.encode("utf-8", "surrogatepass"))

    @property
    def key(self) -> bytes:
        """A digest of the text: what the engine's cache tells apart, in 16 bytes."""
        return hashlib.blake2b(self.text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _response_format(response_format: Any) -> Iterator[EngineGrammar]:
    """`response_format`'s grammar: a `json_schema`'s schema, or a structural tag
    (`json_object` compiles one fixed grammar: nothing new to the engine)."""
    if not isinstance(response_format, Mapping):
        return
    kind = response_format.get("type")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if isinstance(spec, Mapping) and spec.get("schema") is not None:
            yield EngineGrammar("response_format.json_schema.schema", _json_text(spec["schema"]))
    elif kind == "structural_tag":
        yield EngineGrammar("response_format", _json_text(response_format))


def _constrained_tools(raw: Mapping[str, Any]) -> Iterator[EngineGrammar]:
    """The tools of a chat whose tool calls the engine constrains by grammar: a call
    required or named (`tool_choice`), or any function marked `strict`."""
    tools = raw.get("tools")
    choice = raw.get("tool_choice")
    if not tools or choice == "none":
        return
    strict = any(
        isinstance(tool, Mapping)
        and isinstance(tool.get("function"), Mapping)
        and tool["function"].get("strict") is True
        for tool in tools
    )
    if strict or choice == "required" or isinstance(choice, Mapping):
        yield EngineGrammar("tools", _json_text(tools))


def _fields(raw: Mapping[str, Any], prefix: str, names: tuple[str, ...]) -> Iterator[EngineGrammar]:
    for name in names:
        value = raw.get(name)
        if value is not None:
            yield EngineGrammar(prefix + name, _json_text(value))


GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf")
SAMPLING_GRAMMAR_FIELDS = (*GRAMMAR_FIELDS, "structural_tag")


def engine_grammars(
    raw: Mapping[str, Any], served: Container[str] | None = None
) -> list[EngineGrammar]:
    """Every grammar the (validated) body of a chat, completion or `/generate` request
    asks the engine to compile; `served`: the body's fields that reach the engine (the
    others are dropped: they compile nothing), all when None."""
    if served is not None:
        raw = {name: value for name, value in raw.items() if name in served}
    found = [*_fields(raw, "", GRAMMAR_FIELDS), *_response_format(raw.get("response_format"))]
    found += _constrained_tools(raw)
    params = raw.get("sampling_params")
    if isinstance(params, Mapping):
        found += _fields(params, "sampling_params.", SAMPLING_GRAMMAR_FIELDS)
    elif isinstance(params, list):
        for index, item in enumerate(params):
            if isinstance(item, Mapping):
                found += _fields(item, f"sampling_params.{index}.", SAMPLING_GRAMMAR_FIELDS)
    return found
