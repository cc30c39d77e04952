"""The trace file: JSONL, a header line then one request per line (SPEC §6).

Header: ``{"type": "header", "workload", "params", "seed", "num_requests", "tokenizer",
"version"}``. Request lines: ``rid``, ``arrival`` (seconds from the trace start, modeled
time), ``system``, ``segments`` ([{id, text}]), ``suffix``, ``max_tokens``, ``reorder``,
``hot`` and an optional ``meta`` object (e.g. the agent trace's conversation id).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRACE_VERSION = 1


@dataclass(frozen=True)
class Segment:
    """One reusable piece of a prompt: a stable id and its text."""

    id: str
    text: str


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace, as the load generator replays it."""

    rid: str
    arrival: float
    system: str
    segments: tuple[Segment, ...]
    suffix: str
    max_tokens: int
    reorder: bool
    hot: bool
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "rid": self.rid,
            "arrival": round(self.arrival, 6),
            "system": self.system,
            "segments": [{"id": s.id, "text": s.text} for s in self.segments],
            "suffix": self.suffix,
            "max_tokens": self.max_tokens,
            "reorder": self.reorder,
            "hot": self.hot,
        }
        if self.meta:
            doc["meta"] = self.meta
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> TraceRequest:
        return cls(
            rid=str(doc["rid"]),
            arrival=float(doc["arrival"]),
            system=str(doc.get("system") or ""),
            segments=tuple(Segment(str(s["id"]), str(s["text"])) for s in doc["segments"]),
            suffix=str(doc.get("suffix") or ""),
            max_tokens=int(doc["max_tokens"]),
            reorder=bool(doc.get("reorder", True)),
            hot=bool(doc.get("hot", False)),
            meta=dict(doc.get("meta") or {}),
        )

    def joined_user_text(self) -> str:
        """Segments then suffix, blank-line separated: the user message of plain chat."""
        return "\n\n".join([*(s.text for s in self.segments), self.suffix])

    def plain_prompt(self) -> str:
        """System, segments and suffix as one text (for SGLang's native `/generate`)."""
        parts = [self.system] if self.system else []
        return "\n\n".join([*parts, self.joined_user_text()])


@dataclass(frozen=True)
class TraceHeader:
    """What produced the trace: workload name, every parameter and the seed."""

    workload: str
    params: dict[str, Any]
    seed: int
    num_requests: int
    tokenizer: str
    version: int = TRACE_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "header",
            "workload": self.workload,
            "params": self.params,
            "seed": self.seed,
            "num_requests": self.num_requests,
            "tokenizer": self.tokenizer,
            "version": self.version,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> TraceHeader:
        return cls(
            workload=str(doc["workload"]),
            params=dict(doc["params"]),
            seed=int(doc["seed"]),
            num_requests=int(doc["num_requests"]),
            tokenizer=str(doc.get("tokenizer", "")),
            version=int(doc.get("version", TRACE_VERSION)),
        )


@dataclass(frozen=True)
class Trace:
    header: TraceHeader
    requests: tuple[TraceRequest, ...]


def write_trace(path: Path, header: TraceHeader, requests: Iterable[TraceRequest]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        out.write(json.dumps(header.to_json(), sort_keys=True) + "\n")
        for request in requests:
            out.write(json.dumps(request.to_json(), ensure_ascii=False) + "\n")


def read_trace(path: Path) -> Trace:
    """Read a trace; the header line is required, requests are sorted by arrival."""
    header: TraceHeader | None = None
    requests: list[TraceRequest] = []
    with path.open(encoding="utf-8") as src:
        for number, line in enumerate(src, start=1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
                if doc.get("type") == "header":
                    header = TraceHeader.from_json(doc)
                else:
                    requests.append(TraceRequest.from_json(doc))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not a trace line ({exc})") from exc
    if header is None:
        raise ValueError(f"{path}: no header line")
    requests.sort(key=lambda r: r.arrival)
    return Trace(header=header, requests=tuple(requests))
