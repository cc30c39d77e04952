"""`prism-proxy explain`: what one scheduling round would do, or what the proxy finds in
one request without hints, as JSON.

Reads a round description (JSON with `wave_size`, `queue`, ...), and prints the
policy's `RoundPlan`; or a chat, completions or `/generate` body (JSON with `messages`,
`prompt` or `text`), and prints the documents the proxy finds in it (`find_request`).
Bad input exits with code 2 and a one-line error naming the field.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections import Counter
from typing import TYPE_CHECKING, Any, Literal, TextIO

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from prism_proxy.qas.params import QasParams
from prism_proxy.qas.policies import make_policy
from prism_proxy.qas.types import ActiveRequest, QueuedRequest, RoundPlan

if TYPE_CHECKING:
    from prism_proxy.prompts.plan import Plan

EXIT_BAD_INPUT = 2


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def _unique_segments(segments: list[str]) -> list[str]:
    if any(not s for s in segments):
        raise ValueError("segment ids must be non-empty")
    duplicates = sorted(s for s, count in Counter(segments).items() if count > 1)
    if duplicates:
        raise ValueError(f"duplicate segment ids {duplicates}")
    return segments


class QueuedIn(_Strict):
    rid: str = Field(min_length=1)
    arrival: float
    segments: list[str] = []
    reorder: bool = True

    @field_validator("segments")
    @classmethod
    def _check_segments(cls, segments: list[str]) -> list[str]:
        return _unique_segments(segments)


class ActiveIn(_Strict):
    rid: str = Field(min_length=1)
    segments: list[str] = []

    @field_validator("segments")
    @classmethod
    def _check_segments(cls, segments: list[str]) -> list[str]:
        return _unique_segments(segments)


class ExplainInput(_Strict):
    policy: Literal["prism", "fifo", "klpm", "contextpilot-style"] = "prism"
    wave_size: int = Field(ge=0)
    params: dict[str, Any] = {}
    queue: list[QueuedIn] = []
    active: list[ActiveIn] = []


class BadInput(ValueError):
    """A one-line message naming the offending field."""


def _field_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "input"


def parse_input(text: str) -> tuple[ExplainInput, QasParams]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"input: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    try:
        parsed = ExplainInput.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise BadInput(f"{_field_path(first['loc'])}: {first['msg']}") from None
    seen: set[str] = set()
    for where, items in (("queue", parsed.queue), ("active", parsed.active)):
        for index, item in enumerate(items):
            if item.rid in seen:
                raise BadInput(f"{where}[{index}].rid: duplicate rid {item.rid!r}")
            seen.add(item.rid)
    try:
        params = QasParams.from_overrides(parsed.params)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    return parsed, params


def explain(document: ExplainInput, params: QasParams) -> dict[str, Any]:
    """Run one round of the chosen policy on the described snapshot."""
    queue = [QueuedRequest(q.rid, q.arrival, tuple(q.segments), q.reorder) for q in document.queue]
    active = [ActiveRequest(a.rid, tuple(a.segments)) for a in document.active]
    plan = make_policy(document.policy, params).plan_round(queue, active, document.wave_size)
    return plan_to_json(plan, document.policy, document.wave_size)


def plan_to_json(plan: RoundPlan, policy: str, wave_size: int) -> dict[str, Any]:
    return {
        "policy": policy,
        "wave_size": wave_size,
        "priorities": plan.priorities,
        "requests": {
            rid: {"skeleton": list(skeleton), "signature": list(plan.signatures.get(rid, ()))}
            for rid, skeleton in plan.skeletons.items()
        },
        "buckets": [
            {"signature": list(b.signature), "rids": list(b.rids), "score": b.score}
            for b in plan.buckets
        ],
        "wave": [{"rid": e.rid, "lane": e.lane.value} for e in plan.wave],
        "dispatch_priorities": plan.dispatch_priorities,
    }


def find_request(body: dict[str, Any]) -> dict[str, Any]:
    """What the proxy makes of a request (its plan, `prompts.plan`), with every layout
    on and no evidence yet (a first request: blank-line blocks stay in the client's
    order), under the builtin tokenizer: the documents of a single turn (its user
    message, else its system message) or of a prompt, a hint's segments, else a chat's
    turns (the served model's tokenizer moves the numbers, not the message ends)."""
    from prism_proxy.api.chat import ChatCompletionRequest
    from prism_proxy.api.generate import GenerateRequest
    from prism_proxy.prompts.evidence import BlockEvidence
    from prism_proxy.prompts.extraction import ALL_LAYOUTS
    from prism_proxy.prompts.jobs import PromptError
    from prism_proxy.prompts.plan import PlanContext, plan_chat, plan_generate
    from prism_proxy.prompts.serializer import Serializer
    from prism_tokens.tokenizer import load_tokenizer

    serializer = Serializer(load_tokenizer(), 8 << 20, 1 << 20)
    context = PlanContext(serializer, ALL_LAYOUTS, True, BlockEvidence(1 << 20).scoped(""))
    try:
        if "messages" not in body:
            text = body.get("prompt", body.get("text"))
            if not isinstance(text, str):
                raise BadInput("input: expected `messages`, or `prompt` or `text` as a string")
            plan = plan_generate(GenerateRequest.model_validate({"text": text}), {}, context)
        else:
            chat = ChatCompletionRequest.model_validate(body)
            plan = plan_chat(chat, body, context)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise BadInput(f"{_field_path(first['loc'])}: {first['msg']}") from None
    except PromptError as exc:
        raise BadInput(str(exc)) from None
    return _described(plan, tokenizer=serializer.tokenizer.name, chat="messages" in body)


def _described(plan: Plan, *, tokenizer: str, chat: bool) -> dict[str, Any]:
    """A plan as `explain` prints it: its documents (found or hinted), or its turns,
    and who serves it (the token path or the engine's own endpoint)."""
    from prism_proxy.prompts.plan import Forward

    forwarded = isinstance(plan, Forward)
    served = {"served_by": "engine" if forwarded else "token path"}
    job = plan.job if isinstance(plan, Forward) else plan
    prompt = None if job is None else job.prompt
    if prompt is not None:
        found: dict[str, Any] = {"outcome": plan.origin, **served}
        if plan.layout:
            found["layout"] = plan.layout
        if chat and plan.origin != "hinted":
            found["message"] = "system" if prompt.user is not None else "user"
        movable = plan.origin in ("found", "hinted") and prompt.reorder
        return {
            **found,
            "preamble": prompt.preamble,
            "documents": [
                {
                    "id": segment.id.removeprefix("\x00"),
                    "label": prompt.label(position),
                    "text": segment.text,
                    "movable": movable and segment.id not in prompt.fixed,
                    # travels with the document before it (one document's blocks)
                    "glued": segment.id in prompt.glued,
                }
                for position, segment in enumerate(prompt.segments, 1)
            ],
            "suffix": prompt.suffix,
        }
    if plan.origin == "turns" and job is not None and job.segment_tokens is not None:
        ends = list(itertools.accumulate(job.segment_tokens, initial=job.head_tokens))
        ids = job.build(job.segments).prompt_fields["input_ids"]
        return {
            "outcome": "turns",
            **served,
            "tokenizer": tokenizer,
            "tokens": len(ids),
            "head_tokens": job.head_tokens,
            "message_ends": ends,
        }
    return {"outcome": plan.origin, **served}


def run(source: TextIO, out: TextIO, err: TextIO) -> int:
    text = source.read()
    try:
        document = json.loads(text)
        if isinstance(document, dict) and {"messages", "prompt", "text"} & document.keys():
            result = find_request(document)
        else:
            round_input, params = parse_input(text)
            result = explain(round_input, params)
    except json.JSONDecodeError as exc:
        err.write(f"error: input: not valid JSON ({exc.msg} at line {exc.lineno})\n")
        return EXIT_BAD_INPUT
    except BadInput as exc:
        err.write(f"error: {exc}\n")
        return EXIT_BAD_INPUT
    json.dump(result, out, indent=2)
    out.write("\n")
    return 0


def main(path: str | None = None) -> int:
    """Entry point for `prism-proxy explain [FILE]` (stdin when FILE is absent or '-')."""
    if path in (None, "-"):
        return run(sys.stdin, sys.stdout, sys.stderr)
    try:
        with open(path, encoding="utf-8") as source:
            return run(source, sys.stdout, sys.stderr)
    except OSError as exc:
        sys.stderr.write(f"error: input: cannot read {path}: {exc.strerror}\n")
        return EXIT_BAD_INPUT
