"""What QAS queues and what the backend receives, for a request on the token path (SPEC
§1, §4).

A `TokenJob` is the skeleton QAS schedules (segment ids, reorder flag, head and segment
token lengths, prefix key) and `build(order)`, which serializes the prompt in the order
QAS released it and returns the `/generate` prompt fields plus the anchors. A segmented
prompt (hinted, or documents found in its text: `prompts.plan`) becomes one with
`segmented_job`; any other prompt is one private piece (`private_job`, cold lane), and a
chat's turns one of `prompts.conversation`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prism_proxy.api.segments import SegmentedPrompt
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


def found_outcome(prompt: SegmentedPrompt) -> str:
    """`found` when QAS may move the documents found in a prompt (at least two units,
    or one among fixed ones), else `found-ordered`."""
    units = sum(1 for s in prompt.segments if s.id not in prompt.fixed and s.id not in prompt.glued)
    movable = units > 1 or (units == 1 and bool(prompt.fixed))
    return "found" if prompt.reorder and movable else "found-ordered"
