"""The wire contract between the proxy and DART (version `WIRE_VERSION`), the one module
both sides import (SPEC §1, §3, §4).

**Anchors**, with every request. SGLang 0.5.23 accepts `kv_hints` only as a versioned
envelope (`managers/kv_hints.py: KvHintsEnvelope`, unknown top-level keys are dropped and
a dict without `protocol_version`/`message_id` is rejected with 400), so the anchors ride
in one action of that envelope::

    {"protocol_version": "1", "message_id": <rid>,
     "actions": [{"action_id": "prism", "action_type": "prism.dart.anchors",
                  "action_version": WIRE_VERSION,
                  "payload": {"anchors": [{"kind", "segment_id", "offset"}, ...],
                              "priorities": {segment_id: score}, "check": digest}}]}

Requests for SGLang's own OpenAI endpoint (no `kv_hints` field) carry the same envelope
as a JSON string in `sampling_params.custom_params[CUSTOM_PARAMS_KEY]`, with the
`anchor_check` digest of the proxy's tokenization: the engine places the anchors only
on a prompt that matches.

A system anchor's `segment_id` names its head (a hash of the head's token ids); each
head is its own DART owner, `system_owner(segment_id)`, ranked by the table like any
segment. Owners of system heads live in their own namespace, `SYSTEM_OWNER_PREFIX`: no
segment id may start with it, so a head and a segment never share an owner. Ids
starting with NUL (`RESERVED_ID_START`) are the proxy's own (documents and turns it
found); its request model refuses them from clients. A system anchor without a
`segment_id` is read too: every such head shares the owner `system_owner(None)`, which
no table ranks.

`make_kv_hints` builds the envelope; `parse_kv_hints` reads it, the bare
`{"prism": {"anchors": ..., "priorities": ...}}` form (the simulated engine is not bound
by SGLang's envelope) and the typed `KvHintsEnvelope` struct SGLang hands to the
scheduler (read by attribute, so sglang is not imported).

**The control RPC** (served by the plugin, called by the proxy; bearer token):

    POST RPC_PRIORITIES  `PriorityBody` {epoch, table: {segment_id: score}, protect}
    POST RPC_RESET       forget the table and the epoch
    GET  RPC_RESIDENCY?generation=G&since=V   -> `ResidencySummary`
    POST RPC_RETAIN      `Retention` {retain: {segment_id: [score, ttl_s(, tokens)]},
                         release: [id], discard: [id]}

Epochs are integers in [0, MAX_EPOCH] (2**53 - 1: exact in every JSON parser) and
increase with every push; the proxy starts from the wall clock in milliseconds.
"""

from __future__ import annotations

import hashlib
import json
import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Annotated, Any, Self

import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

ACTION_TYPE = "prism.dart.anchors"
# The key of the envelope in `sampling_params.custom_params` (a JSON string: SGLang
# carries only flat JSON values there), for requests that go to SGLang's own OpenAI
# endpoint, which has no `kv_hints` field.
CUSTOM_PARAMS_KEY = "prism_kv_hints"
MAX_CUSTOM_PARAMS_CHARS = 1 << 20
# Tokens before each anchor that `anchor_check` digests.
CHECK_WINDOW = 8
WIRE_VERSION = "1"
ACTION_VERSION = WIRE_VERSION
PROTOCOL_VERSION = "1"
# First characters of every system head's owner; never the start of a segment id.
SYSTEM_OWNER_PREFIX = "\x00sys:"
RESERVED_ID_START = "\x00"


def system_owner(head_id: str | None) -> str:
    """The DART owner, and priority-table key, of the system head `head_id` (None: an
    anchor without an id, from a sender that predates per-head owners)."""
    return SYSTEM_OWNER_PREFIX + (head_id or "")


def is_system_owner(owner: str) -> bool:
    return owner.startswith(SYSTEM_OWNER_PREFIX)


def display_owner(owner: str) -> str:
    """An owner as stats show it: `<system:9f2c...>` for a head, the id for a segment."""
    if not is_system_owner(owner):
        return owner
    head = owner[len(SYSTEM_OWNER_PREFIX) :]
    return f"<system:{head}>" if head else "<system>"


class AnchorKind(StrEnum):
    """What the piece ending at an anchor holds (SPEC §1)."""

    SYSTEM = "system"
    SEGMENT = "segment"
    PRIVATE = "private"


class AnchorError(ValueError):
    """The anchors of a request are malformed."""


@dataclass(frozen=True, slots=True)
class Anchor:
    """The piece `[previous anchor offset, offset)` is of `kind` (segment id if any)."""

    kind: AnchorKind
    segment_id: str | None
    offset: int

    def __post_init__(self) -> None:
        if self.offset <= 0:
            raise AnchorError(f"anchor offset must be positive, got {self.offset}")
        if self.kind is AnchorKind.SEGMENT:
            if not self.segment_id:
                raise AnchorError("a segment anchor needs a segment_id")
            if is_system_owner(self.segment_id):
                raise AnchorError(f"a segment_id may not start with {SYSTEM_OWNER_PREFIX!r}")


def anchor_check(ids: Sequence[int], offsets: Sequence[int]) -> str:
    """A digest of the prompt's length and the `CHECK_WINDOW` tokens before each offset:
    anchors computed from one tokenization are placed on a prompt only if it matches
    (the engine rendered and tokenized the prompt itself)."""
    window: list[int] = [len(ids)]
    for offset in offsets:
        window.extend(ids[max(0, offset - CHECK_WINDOW) : offset])
        window.append(-1)
    return hashlib.blake2b(array("q", window).tobytes(), digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class AnchorHints:
    """A request's anchors (strictly increasing offsets), optional P_t snapshot, and
    optional `anchor_check` digest of the prompt they were computed for."""

    anchors: tuple[Anchor, ...]
    priorities: Mapping[str, float]
    check: str | None = None

    def fits(self, ids: Sequence[int]) -> bool:
        """Whether these anchors belong on prompt `ids` (always, without a check)."""
        if self.check is None:
            return True
        return anchor_check(ids, [a.offset for a in self.anchors]) == self.check

    def __post_init__(self) -> None:
        previous = 0
        for anchor in self.anchors:
            if anchor.offset <= previous:
                raise AnchorError("anchor offsets must be strictly increasing")
            previous = anchor.offset

    @property
    def segment_ids(self) -> frozenset[str]:
        """The reusable segments of the request (not the system prompt)."""
        return frozenset(
            a.segment_id for a in self.anchors if a.kind is AnchorKind.SEGMENT and a.segment_id
        )

    @property
    def owners(self) -> frozenset[str]:
        """The DART owners of the request: its segments and its system head's owner."""
        heads = {system_owner(a.segment_id) for a in self.anchors if a.kind is AnchorKind.SYSTEM}
        return self.segment_ids | heads


def _anchor_from(raw: Any) -> Anchor:
    if not isinstance(raw, Mapping):
        raise AnchorError(f"anchor must be an object, got {type(raw).__name__}")
    try:
        kind = AnchorKind(raw["kind"])
    except (KeyError, ValueError) as exc:
        raise AnchorError(f"bad anchor kind in {raw!r}") from exc
    offset = raw.get("offset")
    if not isinstance(offset, int) or isinstance(offset, bool):
        raise AnchorError(f"anchor offset must be an integer, got {offset!r}")
    segment_id = raw.get("segment_id")
    if segment_id is not None and not isinstance(segment_id, str):
        raise AnchorError(f"segment_id must be a string, got {segment_id!r}")
    return Anchor(kind=kind, segment_id=segment_id, offset=offset)


def hints_from_payload(payload: Any) -> AnchorHints:
    """Validate `{"anchors": [...], "priorities": {...}}`; raises `AnchorError`."""
    if not isinstance(payload, Mapping):
        raise AnchorError("prism hints must be an object")
    raw_anchors = payload.get("anchors", [])
    if not isinstance(raw_anchors, Sequence) or isinstance(raw_anchors, str | bytes):
        raise AnchorError("anchors must be a list")
    raw_priorities = payload.get("priorities") or {}
    if not isinstance(raw_priorities, Mapping):
        raise AnchorError("priorities must be an object")
    priorities: dict[str, float] = {}
    for key, value in raw_priorities.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise AnchorError(f"priority of {key!r} must be a number")
        if not math.isfinite(value):
            raise AnchorError(f"priority of {key!r} must be finite")
        priorities[str(key)] = float(value)
    check = payload.get("check")
    if check is not None and not isinstance(check, str):
        raise AnchorError("check must be a string")
    return AnchorHints(tuple(_anchor_from(a) for a in raw_anchors), priorities, check)


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def parse_kv_hints(kv_hints: Any) -> AnchorHints | None:
    """The PRISM anchors inside a request's `kv_hints`, or None when it carries none.

    Accepts the SGLang envelope (dict or `KvHintsEnvelope`) and the bare
    `{"prism": {...}}` form. Raises `AnchorError` when PRISM's payload is malformed.
    """
    if kv_hints is None:
        return None
    if isinstance(kv_hints, Mapping) and "prism" in kv_hints:
        return hints_from_payload(kv_hints["prism"])
    actions = _field(kv_hints, "actions")
    if not actions:
        return None
    for action in actions:
        if _field(action, "action_type") == ACTION_TYPE:
            return hints_from_payload(_field(action, "payload"))
    return None


def parse_custom_params(custom_params: Any) -> AnchorHints | None:
    """The PRISM anchors in a request's `sampling_params.custom_params`
    (`CUSTOM_PARAMS_KEY`), or None when it carries none. Raises `AnchorError`."""
    if not isinstance(custom_params, Mapping):
        return None
    text = custom_params.get(CUSTOM_PARAMS_KEY)
    if text is None:
        return None
    if not isinstance(text, str) or len(text) > MAX_CUSTOM_PARAMS_CHARS:
        raise AnchorError(f"{CUSTOM_PARAMS_KEY} must be a JSON string of at most 1 MiB")
    try:
        return parse_kv_hints(json.loads(text))
    except ValueError as exc:
        raise AnchorError(f"{CUSTOM_PARAMS_KEY}: {exc}") from None


def request_hints(
    kv_hints: Any, custom_params: Any, prompt_ids: Sequence[int]
) -> AnchorHints | None:
    """A request's anchors, from `kv_hints` or else `custom_params`, or None. Raises
    `AnchorError` when they are malformed or do not fit `prompt_ids`, the prompt the
    engine is about to cache."""
    hints = parse_kv_hints(kv_hints)
    if hints is None:
        hints = parse_custom_params(custom_params)
    if hints is not None and not hints.fits(prompt_ids):
        raise AnchorError("the anchors were computed for another tokenization of the prompt")
    return hints


def make_kv_hints(
    anchors: Sequence[Anchor] | Sequence[Mapping[str, Any]],
    priorities: Mapping[str, float] | None = None,
    *,
    message_id: str,
    check: str | None = None,
) -> dict[str, Any]:
    """The `kv_hints` value that SGLang 0.5.23 accepts and the plugin reads; `check`:
    the `anchor_check` of the prompt, when the engine tokenizes it itself."""
    payload_anchors = [
        dict(a)
        if isinstance(a, Mapping)
        else {"kind": str(a.kind), "segment_id": a.segment_id, "offset": a.offset}
        for a in anchors
    ]
    payload: dict[str, Any] = {"anchors": payload_anchors}
    if priorities:
        payload["priorities"] = dict(priorities)
    if check is not None:
        payload["check"] = check
    return {
        "protocol_version": PROTOCOL_VERSION,
        "message_id": message_id,
        "actions": [
            {
                "action_id": "prism",
                "action_type": ACTION_TYPE,
                "action_version": ACTION_VERSION,
                "payload": payload,
            }
        ],
    }


# --- the control RPC ---------------------------------------------------------------------
RPC_PRIORITIES = "/prism/priorities"
RPC_RESET = "/prism/reset"
RPC_RESIDENCY = "/prism/residency"
RPC_RETAIN = "/prism/retain"
MAX_EPOCH = 2**53 - 1
# The owners DART protects from eviction per push when the proxy does not say (f).
DEFAULT_PROTECT = 8


class PriorityBody(BaseModel):
    """Body of `POST RPC_PRIORITIES`: P̂_t per segment (or system-head owner) and f."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    epoch: int = Field(ge=0, le=MAX_EPOCH)
    table: dict[str, float]
    protect: int = Field(default=DEFAULT_PROTECT, ge=0)


# Retention entries one DART holds at most; a push beyond it drops the lowest scores.
MAX_RETAINED = 16384
MAX_OWNER_CHARS = 256
# The longest time-to-live a retention may ask for.
MAX_RETAIN_TTL_S = 3600.0


# The most path tokens a retention entry may name.
MAX_RETAIN_TOKENS = 2**40


@dataclass(frozen=True, slots=True)
class Retention:
    """What the proxy tells DART about paused agent sessions (`POST RPC_RETAIN`): keep the
    paths ending at these owners a while, forget some entries, discard some owners.

    `retain` maps an owner (a segment id, normally the last piece of a paused agent
    session's prompt) to `(score, ttl_s, tokens)`, `tokens` being what its path holds (for
    DART's cap on retention; None when not known): DART evicts retained owners only after
    every unretained one, lower scores first, and forgets each entry `ttl_s` seconds after
    receiving it (its own clock: no clocks to agree on). `release` forgets entries at once
    (the session came back). `discard` ranks resident owners with private pieces, by last
    access, until they leave the tree (a finished session's own pieces, which nobody will
    read again, and a paused one's whose retention was not earned). A retained leaf holds
    its whole path, so one entry keeps one session's history without keeping every path
    through a shared head.

    The one form of this word on both sides: the proxy's session table makes it, its
    control client sends it (`as_dict`, the JSON body), the RPC reads it (`from_json`) and
    DART applies it. Every entry's bounds are checked here, on construction; how many
    entries one body may carry (`MAX_RETAINED` per list) is the wire's bound, checked by
    `from_json` (the control client sends words in bodies of at most that many), so that
    `a + b` (both, `b`'s word winning for an owner named in both) never fails.
    """

    retain: Mapping[str, tuple[float, float, int | None]] = field(default_factory=dict)
    release: tuple[str, ...] = ()
    discard: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        retain: dict[str, tuple[float, float, int | None]] = {}
        for owner, (score, ttl_s, tokens) in self.retain.items():
            if not math.isfinite(score):
                raise ValueError(f"score of {owner!r} must be finite")
            if not 0.0 <= ttl_s <= MAX_RETAIN_TTL_S:
                raise ValueError(f"ttl_s of {owner!r} must be in [0, {MAX_RETAIN_TTL_S}]")
            if tokens is not None:
                if not 0 <= tokens <= MAX_RETAIN_TOKENS:
                    raise ValueError(f"tokens of {owner!r} must be in [0, 2**40]")
                tokens = int(tokens)  # JSON may spell a count as a float
            retain[owner] = (score, ttl_s, tokens)
        release, discard = tuple(self.release), tuple(self.discard)
        if any(len(o) > MAX_OWNER_CHARS for o in (*retain, *release, *discard)):
            raise ValueError(f"owner ids are at most {MAX_OWNER_CHARS} characters")
        object.__setattr__(self, "retain", MappingProxyType(retain))
        object.__setattr__(self, "release", release)
        object.__setattr__(self, "discard", discard)

    def __bool__(self) -> bool:
        return bool(self.retain or self.release or self.discard)

    def __add__(self, later: Retention) -> Retention:
        """Both words, `later`'s winning for an owner named in both."""
        if not self:
            return later
        if not later:
            return self
        named = {*later.retain, *later.release, *later.discard}
        retain = {o: e for o, e in self.retain.items() if o not in named}
        retain.update(later.retain)
        return Retention(
            retain,
            (*(o for o in self.release if o not in named), *later.release),
            (*(o for o in self.discard if o not in named), *later.discard),
        )

    def as_dict(self) -> dict[str, Any]:
        """The JSON body: `{"retain": {owner: [score, ttl_s(, tokens)]}, "release": [owner],
        "discard": [owner]}`."""
        return {
            "retain": {
                o: [s, t] if k is None else [s, t, k] for o, (s, t, k) in self.retain.items()
            },
            "release": list(self.release),
            "discard": list(self.discard),
        }

    @classmethod
    def from_json(cls, data: bytes | str) -> Retention:
        """The retention in a body, checked strictly; raises `ValueError` (pydantic's
        `ValidationError`, orjson's `JSONDecodeError`) when it is malformed."""
        # orjson: strict JSON, nesting <= 1024 (no RecursionError on "[[[[...").
        body = _RetainBody.model_validate(orjson.loads(data))
        retain = {o: (e[0], e[1], e[2] if len(e) == 3 else None) for o, e in body.retain.items()}
        return cls(retain, tuple(body.release), tuple(body.discard))  # type: ignore[arg-type]


# The empty word: nothing to retain, release or discard.
NO_RETENTION = Retention()


class _RetainBody(BaseModel):
    """The JSON shape of a `Retention` (whose bounds the type itself checks)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    retain: dict[str, Annotated[list[float], Field(min_length=2, max_length=3)]] = Field(
        default_factory=dict, max_length=MAX_RETAINED
    )
    release: list[str] = Field(default_factory=list, max_length=MAX_RETAINED)
    discard: list[str] = Field(default_factory=list, max_length=MAX_RETAINED)


class _ResidencyBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    generation: str = Field(min_length=1, max_length=256)
    version: int = Field(ge=0)
    full: bool
    resident: tuple[str, ...]
    gone: tuple[str, ...]

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.full and self.gone:
            raise ValueError("a full summary lists no gone segments")
        if not self.full and not set(self.resident).isdisjoint(self.gone):
            raise ValueError("a delta lists a segment as both resident and gone")
        return self


@dataclass(frozen=True, slots=True)
class ResidencySummary:
    """One answer of `GET RPC_RESIDENCY?generation=G&since=V`.

    `generation` names the DART instance (a restarted server starts a new one), and
    `version` counts its residency changes. `full`: `resident` is the whole set and
    `gone` is empty; otherwise both list the segments whose state changed after `since`.
    """

    generation: str
    version: int
    full: bool
    resident: tuple[str, ...] = ()
    gone: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "version": self.version,
            "full": self.full,
            "resident": list(self.resident),
            "gone": list(self.gone),
        }

    @classmethod
    def from_json(cls, data: bytes | str) -> ResidencySummary:
        """The summary in an answer, checked strictly; raises `ValueError` (pydantic's
        `ValidationError`) when it is malformed."""
        body = _ResidencyBody.model_validate_json(data)
        return cls(body.generation, body.version, body.full, body.resident, body.gone)
