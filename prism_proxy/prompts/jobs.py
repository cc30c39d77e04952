"""From a client request to what QAS queues and what the backend receives (SPEC §1, §4).

A `TokenJob` is a request on the token path: the skeleton QAS schedules (segment ids,
reorder flag, head and segment token lengths, prefix key) and `build(order)`, which
serializes the prompt in the order QAS released it and returns the `/generate` prompt
fields plus the anchors. Hinted requests go through the serializer, and so do requests
without hints whose text holds documents in a known layout (`find_documents`, SPEC §1:
"Requests without hints are segmented by the proxy"); the others are one private piece
(cold lane).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from prism_proxy.api.hints import PrismHint
from prism_proxy.api.messages import ChatMessage
from prism_proxy.api.segments import Segment, SegmentedPrompt, format_validation_error
from prism_proxy.prompts.evidence import BlockEvidence, ScopedEvidence
from prism_proxy.prompts.extraction import extract
from prism_proxy.prompts.serializer import Serializer
from prism_proxy.qas.types import QueuedRequest
from prism_wire import Anchor, AnchorKind, make_kv_hints


class PromptError(ValueError):
    """A request's prompt or hints are unusable; `param` names the field (400)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclass(frozen=True, slots=True)
class Dispatch:
    """`/generate` prompt fields (`input_ids` or `text`) and the anchors (SPEC §4)."""

    prompt_fields: dict[str, Any]
    anchors: Sequence[Anchor]


@dataclass(frozen=True, slots=True)
class TokenJob:
    """A request on the token path: the skeleton QAS schedules (`queued`) and `build`,
    which serializes the prompt in a released order. `origin` and `layout` say where its
    segments came from, for the metrics (`prism:extraction_total`): `hinted`, found in a
    layout (`found`, or `found-ordered` when they may not move), the chat's `turns`
    (`messages`), `none` found, extraction `off` (the plan names a job its builder left
    ""). `prompt`: the segmented prompt it serializes (hinted or found), if any."""

    segments: tuple[str, ...]
    reorder: bool
    prefix_key: str
    head_tokens: int
    segment_tokens: tuple[int, ...] | None
    build: Callable[[Sequence[str]], Dispatch]
    fixed: frozenset[str] = frozenset()
    pinned: frozenset[str] = frozenset()
    glued: frozenset[str] = frozenset()
    origin: str = ""
    layout: str = ""
    prompt: SegmentedPrompt | None = None

    def payload(
        self,
        order: Sequence[str],
        *,
        rid: str,
        priorities: Mapping[str, float],
        sampling_params: dict[str, Any],
        extra_fields: Mapping[str, Any] | None = None,
        see: Callable[[Sequence[int], list[int]], dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """The backend `/generate` body (minus `stream`) of this job released in
        `order` with the dispatch priorities of its segments (SPEC §4). `see(input_ids,
        anchor offsets)` may add fields of its own (what clients share, `sharing`)."""
        dispatch = self.build(order)
        payload: dict[str, Any] = {
            **(extra_fields or {}),
            **dispatch.prompt_fields,
            "rid": rid,
            "sampling_params": sampling_params,
        }
        if dispatch.anchors:
            # SGLang 0.5.23 only accepts kv_hints as a versioned envelope (a bare
            # {"prism": ...} is a 400); the DART plugin and prism-sim read this form.
            payload["kv_hints"] = make_kv_hints(dispatch.anchors, priorities, message_id=rid)
        if see is not None:
            offsets = [a.offset for a in dispatch.anchors]
            payload.update(see(payload.get("input_ids") or (), offsets))
        return payload

    def queued(
        self, rid: str, arrival: float, group: str = "", program_start: float | None = None
    ) -> QueuedRequest:
        """What QAS schedules for this job (SPEC §2); `group`: the client's grouping hint;
        `program_start`: the agent program it continues started then."""
        return QueuedRequest(
            rid=rid,
            arrival=arrival,
            segments=self.segments,
            reorder=self.reorder,
            prefix_key=self.prefix_key,
            head_tokens=self.head_tokens,
            segment_tokens=self.segment_tokens,
            fixed=self.fixed,
            pinned=self.pinned,
            glued=self.glued,
            group=group,
            program_start=program_start,
        )


def message_text(message: ChatMessage) -> str:
    """A message's text (content parts of type `text` joined)."""
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text or "" for part in content)


def segmented_job(serializer: Serializer, prompt: SegmentedPrompt, *, chat: bool) -> TokenJob:
    """QAS gets the token lengths from the serializer's caches; the prompt is serialized
    once, at release, in the order QAS chose."""
    try:
        in_system = prompt.user is not None
        head_tokens = serializer.head_tokens(
            prompt.system, chat, prompt.preamble, in_system=in_system
        )
    except ValueError as exc:  # e.g. a template without a system role
        raise PromptError("prism", str(exc)) from exc
    lengths = serializer.skeleton_lengths(prompt)
    empty_suffix = not prompt.suffix or not serializer.tokenizer.encode(prompt.suffix)
    if not chat and not head_tokens and not any(lengths.values()) and empty_suffix:
        raise PromptError("prism", "the prompt has no tokens")  # it would stop the engine

    def build(order: Sequence[str]) -> Dispatch:
        serialized = serializer.serialize(prompt, order, chat)
        if not serialized.input_ids:  # an empty prompt stops the engine
            raise PromptError("prism", "the prompt has no tokens")
        return Dispatch({"input_ids": serialized.input_ids}, serialized.anchors)

    return TokenJob(
        segments=tuple(lengths),
        reorder=prompt.reorder,
        prefix_key=serializer.prefix_key(
            prompt.system, chat, prompt.preamble, in_system=prompt.user is not None
        ),
        fixed=prompt.fixed,
        pinned=prompt.pinned,
        glued=prompt.glued,
        head_tokens=head_tokens,
        segment_tokens=tuple(lengths.values()),
        build=build,
        origin="" if prompt.layout is None else found_outcome(prompt),
        layout=prompt.layout or "",
        prompt=prompt,
    )


def private_job(
    prompt_fields: dict[str, Any], num_tokens: int | None, origin: str = ""
) -> TokenJob:
    """A request without hints: its whole prompt is private (cold lane)."""
    anchors = [Anchor(AnchorKind.PRIVATE, None, num_tokens)] if num_tokens else []
    dispatch = Dispatch(prompt_fields, anchors)
    return TokenJob((), False, "", 0, None, lambda _order: dispatch, origin=origin)


def hinted_prompt(hint: PrismHint, *, system: str | None, suffix: str | None) -> SegmentedPrompt:
    """The `SegmentedPrompt` of a hint; `system`/`suffix` fill what the hint omits."""
    suffix = hint.suffix if hint.suffix is not None else suffix
    if suffix is None:
        raise PromptError("prism.suffix", "missing, and the request has no prompt to use")
    data = {
        "system": hint.system if hint.system is not None else system,
        "segments": [{"id": s.id, "text": s.text} for s in hint.segments],
        "suffix": suffix,
        "reorder": hint.reorder,
    }
    try:
        return SegmentedPrompt.model_validate(data)
    except ValidationError as exc:
        path, _, message = format_validation_error(exc).partition(": ")
        raise PromptError(f"prism.{path}", message) from None


def hinted_job(
    serializer: Serializer,
    hint: PrismHint,
    *,
    system: str | None,
    suffix: str | None,
    chat: bool,
) -> TokenJob:
    """The token job of a hinted request; `chat` is the endpoint's default, used when
    the hint does not set `chat` itself."""
    prompt = hinted_prompt(hint, system=system, suffix=suffix)
    return segmented_job(serializer, prompt, chat=chat if hint.chat is None else hint.chat)


def chat_defaults(messages: Sequence[ChatMessage]) -> tuple[str | None, str | None]:
    """(system, suffix): the first system/developer message and the last user message."""
    system = next((message_text(m) for m in messages if m.role in ("system", "developer")), None)
    suffix = next((message_text(m) for m in reversed(messages) if m.role == "user"), None)
    return system, suffix


def found_outcome(prompt: SegmentedPrompt) -> str:
    """`found` when QAS may move the documents found in a prompt (at least two units,
    or one among fixed ones), else `found-ordered`."""
    units = sum(1 for s in prompt.segments if s.id not in prompt.fixed and s.id not in prompt.glued)
    movable = units > 1 or (units == 1 and bool(prompt.fixed))
    return "found" if prompt.reorder and movable else "found-ordered"


def document_id(text: str) -> str:
    """A found document's segment id: derived from its text (the same document in any
    request, at any position, under any label, has the same id), in a namespace no
    client's segment id can enter (NUL first)."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()
    return "\x00doc:" + digest


def find_documents(
    text: str,
    *,
    system: str | None,
    layouts: Collection[str],
    reorder: bool,
    evidence: BlockEvidence | ScopedEvidence,
    user: str | None = None,
) -> SegmentedPrompt | None:
    """The documents in one message's (or one prompt's) `text` as a `SegmentedPrompt`
    (its `layout` the one they were found in), or None when none are found (the request
    then goes as one private piece).
    `text` is the user message after `system`, or, with `user`, the system message
    before the user message `user`.

    The text inside each document is never changed: served in the client's order, the
    prompt reads exactly as the client wrote it. Documents may move where their
    boundaries are justified: by the layout itself (tags, numbered labels, headers),
    or, for blocks split at blank lines, by evidence across the client's requests
    (`prompts.evidence`): blocks move only as units, runs the evidence never saw apart
    (`glued`), so a document of several blocks is never split; leading units that only
    ever opened the list stay in front (`pinned`), trailing ones that only ever closed
    it at the end (`fixed`). A numbered layout's
    labels follow the positions served ("[1] " is always the first document the model
    reads), so the same document under another number is the same segment. Documents
    joined by one separator keep it between them as a `joiner`, so a document's tokens
    do not depend on where it lands.
    """
    if not layouts:
        return None
    found = extract(text, layouts)
    if found is None:
        return None
    if user is not None:
        # In the system message no question follows the documents: its last block is
        # one of them (LangChain's RAG tutorial: the instruction, then the documents).
        found = found.with_no_question()
    documents, joiner, suffix = list(found.documents), None, found.suffix
    trailing = [d[len(d.rstrip()) :] for d in documents]
    if len(set(trailing[:-1])) <= 1:
        # One separator between documents (the last's goes to the suffix): a joiner
        # tokenized on its own, so each document's tokens are the same at any position.
        joiner = trailing[0] if len(documents) > 1 else ""
        documents = [d.rstrip() for d in documents]
        suffix = trailing[-1] + suffix
    ids = [document_id(document.rstrip()) for document in documents]
    if len(set(ids)) != len(ids):
        return None  # a document repeated within the request: nothing to gain, and ambiguous
    fixed: list[str] = []
    pinned: list[str] = []
    glued: frozenset[str] = frozenset()
    if not found.certain:
        judged = evidence.judge(found.documents)
        glued = frozenset(i for i, g in zip(ids, judged.glued, strict=True) if g)
        lead, tail = judged.in_place()
        pinned = ids[:lead]
        fixed = pinned + ids[tail:]
    try:
        prompt = SegmentedPrompt(
            system=system,
            preamble=found.preamble,
            # ids of the proxy's own making, in the namespace clients' ids are refused
            segments=[
                Segment.model_construct(id=i, text=d) for i, d in zip(ids, documents, strict=True)
            ],
            suffix=suffix,
            separator="",
            joiner=joiner,
            label_format=found.label_format,
            reorder=reorder,
            fixed=frozenset(fixed),
            pinned=frozenset(pinned),
            glued=glued,
            user=user,
            layout=found.layout,
        )
    except ValidationError:
        return None  # beyond the limits of a segmented prompt: served as one piece
    return prompt


def single_turn(messages: Sequence[ChatMessage]) -> tuple[str | None, str] | None:
    """(system, user text) of a chat of at most one system message then one user
    message, all text; None for other chats (they go as one private piece)."""
    if not messages or messages[-1].role != "user":
        return None
    system = None
    if len(messages) == 2 and messages[0].role in ("system", "developer"):
        system = message_text(messages[0])
    elif len(messages) != 1:
        return None
    if not all(m.is_text() for m in messages):
        return None
    return system, message_text(messages[-1])
