"""Message structure as segments (SPEC §1): a chat without hints is a chain of turns.

A multi-turn chat, or an agent loop that re-sends its history with every call, is cut
where each message ends in the rendered prompt. The first piece (the system turn, with
the `tools` a template writes there) is the request's head; each later message but the
last is a segment; the rest (the last message and the generation prompt) is private.
Segment ids chain: a turn's id hashes its tokens and the id of the piece before, so
equal ids mean equal prefixes, and the next call of an agent loop repeats every id of
the call before. Nothing is reordered.

Cuts are found without knowing the template: the chat rendered up to message k (no
generation prompt) must be a prefix of the whole rendering, and the position must be
one where the tokenizer cuts the text too (an edge of an added token,
`ChatPieces.encode_cut`), so the pieces' ids are exactly the ids of the whole text.
At most `MAX_CUTS` are looked for (`_candidates`): the first message ends, every
stride-th, and the last two.

`template_messages` and `template_tools` give the template what SGLang 0.5.23's OpenAI
endpoint gives it (its message models dumped, tool-call arguments parsed, None fields
dropped, text parts flattened for templates that take string content; tools as its
`Tool` model dumps them, filtered by `tool_choice`), so the proxy renders what the
engine renders (tests/sglang/test_conversation_contract.py holds this against SGLang's
own code).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import jinja2
import jinja2.nodes
import orjson

from backend_plugin.dart.anchors import anchor_check
from prism_proxy.evidence import BlockEvidence
from prism_proxy.prompts import Dispatch, TokenJob, find_documents, private_job, segmented_job
from prism_proxy.serializer import Serializer, prefix_key_of
from prism_proxy.tokenizer import ChatTemplateError, Tokenizer

MAX_CUTS = 16
TURN_ID_PREFIX = "\x00turn:"
ContentFormat = Literal["string", "openai"]

# SGLang's ChatCompletionMessageGenericParam fields, in its order (a user message has
# only role and content).
_MESSAGE_FIELDS = (
    "role", "content", "tool_call_id", "name", "phase", "reasoning_content", "tool_calls",
    "tools", "prefix",
)  # fmt: skip
_FUNCTION_FIELDS = ("description", "name", "parameters", "strict", "defer_loading")
_TEXT_PARTS = ("text", "input_text")


class NotRenderable(ValueError):
    """The request holds something the proxy does not render as the engine would."""


# --- what the template is given ---------------------------------------------------------
def _reads_content_parts(node: jinja2.nodes.Node) -> bool:
    """`message['content']`, `message.content` (or `msg`/`m`), through filters, tests and
    slices: SGLang's test for a template that loops over content parts."""
    while isinstance(node, jinja2.nodes.Filter | jinja2.nodes.Test) or (
        isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice)
    ):
        if node.node is None:
            return False
        node = node.node
    if isinstance(node, jinja2.nodes.Getitem):
        key = node.arg.value if isinstance(node.arg, jinja2.nodes.Const) else None
    elif isinstance(node, jinja2.nodes.Getattr):
        key = node.attr
    else:
        return False
    target = node.node
    return (
        key == "content"
        and isinstance(target, jinja2.nodes.Name)
        and target.ctx == "load"
        and target.name in ("message", "msg", "m")
    )


@functools.lru_cache(maxsize=8)  # one template per served model: parsed once
def content_format(template: str | None) -> ContentFormat:
    """Whether a chat template takes message content as a string or as OpenAI parts, as
    SGLang decides it (`detect_jinja_template_content_format`)."""
    if not template:
        return "string"
    if any(word in template for word in ("image", "audio", "video", "vision")):
        return "openai"
    try:
        tree = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
    except jinja2.TemplateError:
        return "string"
    loops = tree.find_all(jinja2.nodes.For)
    return "openai" if any(_reads_content_parts(loop.iter) for loop in loops) else "string"


def _arguments(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError:
        raise NotRenderable("tool call arguments are not JSON") from None
    if not isinstance(parsed, dict):
        raise NotRenderable("tool call arguments are not a JSON object")
    return parsed


def _tool_call(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("function"), Mapping):
        raise NotRenderable("a tool call without a function")
    function = raw["function"]
    arguments = _arguments(function.get("arguments"))
    return {
        "id": raw.get("id"),
        "index": raw.get("index"),
        "type": raw.get("type", "function"),
        "function": {"name": function.get("name"), "arguments": arguments},
    }


def template_tool(raw: Any) -> dict[str, Any]:
    """One tool as SGLang's `Tool.model_dump()` gives it to the template: the function's
    fields in the client's order, then the ones it left out (None), no None `strict` or
    `defer_loading`; the tool's own `defer_loading` last."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("function"), Mapping):
        raise NotRenderable("a tool without a function")
    given = raw["function"]
    function = {name: given.get(name) for name in _FUNCTION_FIELDS}
    if function["defer_loading"] is None:
        function["defer_loading"] = raw.get("defer_loading")
    for name in ("strict", "defer_loading"):
        if function[name] is None:
            del function[name]
    order = [key for key in given if key in function]
    order += [key for key in function if key not in order]
    return {
        "type": raw.get("type", "function"),
        "function": {key: function[key] for key in order},
        "defer_loading": raw.get("defer_loading"),
    }


def template_tools(tools: Sequence[Any] | None, tool_choice: Any) -> list[dict[str, Any]] | None:
    """The `tools` the template renders: none for `tool_choice` "none" (the default
    without tools), only the named one for a named choice."""
    if not tools or tool_choice == "none":
        return None
    if isinstance(tool_choice, Mapping):
        name = (tool_choice.get("function") or {}).get("name")
        chosen = [
            t
            for t in tools
            if isinstance(t, Mapping) and (t.get("function") or {}).get("name") == name
        ]
        return [template_tool(t) for t in chosen] or None
    return [template_tool(t) for t in tools]


def _content(content: Any, fmt: ContentFormat, role: str) -> Any:
    """Text as the template gets it: a string-content template gets the text parts
    joined by spaces (other parts dropped, as SGLang drops them); a parts template gets
    text parts (the proxy does not render others)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = [p for p in content if isinstance(p, Mapping)]
    texts = [str(p.get("text", "")) for p in parts if p.get("type") in _TEXT_PARTS]
    if fmt == "string" or role == "tool":
        return " ".join(texts)
    if len(texts) != len(content):
        raise NotRenderable("content parts other than text")
    return [{"type": "text", "text": text} for text in texts]


def template_messages(
    messages: Sequence[Mapping[str, Any]], fmt: ContentFormat, *, final_assistant: bool = False
) -> list[dict[str, Any]]:
    """The messages the template renders. Raises `NotRenderable` for what the proxy
    cannot render as SGLang does: non-text parts for a parts template, and, unless
    `final_assistant`, a last message of the assistant's (a continuation)."""
    out: list[dict[str, Any]] = []
    for raw in messages:
        role = str(raw.get("role", "")).lower()
        if role == "user":
            message: dict[str, Any] = {"role": "user", "content": raw.get("content")}
        else:
            message = {name: raw.get(name) for name in _MESSAGE_FIELDS}
            message["role"] = role
            if message["tool_calls"] is not None and role == "assistant":
                message["tool_calls"] = [_tool_call(c) for c in message["tool_calls"]]
            if message["tools"] is not None:
                message["tools"] = [template_tool(t) for t in message["tools"]]
        parts = isinstance(message["content"], list)
        message["content"] = _content(message["content"], fmt, role)
        message = {key: value for key, value in message.items() if value is not None}
        if parts and fmt == "openai":  # SGLang rebuilds such a message, content last
            message["content"] = message.pop("content")
        out.append(message)
    if not final_assistant and (not out or out[-1]["role"] == "assistant"):
        raise NotRenderable("the last message is the assistant's (a continuation)")
    return out


# --- cuts and the job -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Turns:
    """A rendered chat's ids and the token offsets where its messages end (strictly
    increasing, each inside the prompt)."""

    ids: list[int]
    cuts: tuple[int, ...]


def _candidates(count: int) -> list[int]:
    """Message counts whose rendering may end a piece: 0 (what a template writes before
    the first message: tools), 1 and 2, every multiple of a stride, and the last two.
    The stride is the smallest power of two that keeps them within `MAX_CUTS`: the cuts
    of a growing history stay where they were (until the stride doubles), so the next
    call of an agent loop repeats the ids of the call before up to its last stride cut."""
    if count <= MAX_CUTS:
        return list(range(count))
    stride = 1
    while (count - 1) // stride > MAX_CUTS - 5:
        stride *= 2
    middle = range(stride * (3 // stride + 1), count - 2, stride)
    return sorted({0, 1, 2, *middle, count - 2, count - 1})


def find_turns(
    tokenizer: Tokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
) -> Turns:
    """Render `messages` (with `tools`) and cut at message ends; raises
    `ChatTemplateError` when the template cannot render the chat."""
    full = tokenizer.render_chat(messages, add_generation_prompt=True, tools=tools)
    pieces = tokenizer.chat_pieces
    if pieces is None:
        return Turns(tokenizer.encode(full), ())
    ends: list[int] = []
    for k in _candidates(len(messages)):
        try:
            text = tokenizer.render_chat(messages[:k], add_generation_prompt=False, tools=tools)
        except ChatTemplateError:
            continue  # e.g. a template that needs a user message first
        if (not ends or len(text) > ends[-1]) and len(text) < len(full) and full.startswith(text):
            ends.append(len(text))
    ids, offsets = pieces.encode_cut(full, ends)
    cuts: list[int] = []
    for offset in offsets:
        if offset is not None and (cuts[-1] if cuts else 0) < offset < len(ids):
            cuts.append(offset)
    return Turns(ids, tuple(cuts))


def _turn_id(previous: bytes, ids: Sequence[int]) -> bytes:
    return hashlib.blake2b(previous + array("I", ids).tobytes(), digest_size=12).digest()


def turns_job(turns: Turns) -> TokenJob:
    """The token job of a cut chat: head = the first piece, chained segment ids for the
    later pieces, the rest private (a chat without cuts is one private piece)."""
    ids, cuts = turns.ids, turns.cuts
    anchors: list[dict[str, Any]] = []
    segments: list[str] = []
    lengths: list[int] = []
    head_key = ""
    if cuts:
        head_key = prefix_key_of(ids[: cuts[0]])
        anchors.append({"kind": "system", "segment_id": head_key, "offset": cuts[0]})
        chain = bytes.fromhex(head_key)
        for start, end in itertools.pairwise(cuts):
            chain = _turn_id(chain, ids[start:end])
            segments.append(TURN_ID_PREFIX + chain.hex())
            lengths.append(end - start)
            anchors.append({"kind": "segment", "segment_id": segments[-1], "offset": end})
    anchors.append({"kind": "private", "segment_id": None, "offset": len(ids)})
    dispatch = Dispatch({"input_ids": ids}, anchors)
    return TokenJob(
        segments=tuple(segments),
        reorder=False,
        prefix_key=head_key,
        head_tokens=cuts[0] if cuts else 0,
        segment_tokens=tuple(lengths) if cuts else None,
        build=lambda _order: dispatch,
    )


def dispatch_check(dispatch: Dispatch) -> str:
    """The `anchor_check` of a dispatch's prompt and anchors (for an engine that renders
    and tokenizes the prompt itself)."""
    return anchor_check(
        dispatch.prompt_fields["input_ids"], [a["offset"] for a in dispatch.anchors]
    )


# --- a chat without hints -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ChatJob:
    """The token job of a chat without hints, and what was found in it for the metrics
    (`outcome`: found, found-ordered, turns, none, off; `layout`)."""

    job: TokenJob
    outcome: str
    layout: str = ""


def _single_turn(given: Sequence[Mapping[str, Any]]) -> tuple[str | None, str] | None:
    """(system, user text) of a chat of one user message after at most one system (or
    developer) message, with string content and nothing else; None otherwise."""
    if not given or given[-1]["role"] != "user" or len(given) > 2:
        return None
    if len(given) == 2 and given[0]["role"] not in ("system", "developer"):
        return None
    if any(set(m) - {"role", "content"} or not isinstance(m["content"], str) for m in given):
        return None
    return (given[0]["content"] if len(given) == 2 else None), given[-1]["content"]


def chat_job(
    serializer: Serializer,
    messages: Sequence[Mapping[str, Any]],
    *,
    layouts: Sequence[str],
    reorder: bool,
    evidence: BlockEvidence,
) -> ChatJob:
    """How the proxy serves a text chat without hints (`messages` as forwarded):
    documents found in a single turn's user message, or else in its system message
    (`prompts.find_documents`); else the chat cut at its message ends; with no
    `layouts` (segmentation off), one private piece. Raises `NotRenderable` (a
    continuation of the assistant's last message) and `ChatTemplateError`."""
    tokenizer = serializer.tokenizer
    given = template_messages(messages, content_format(tokenizer.chat_template))
    if not layouts:
        ids = tokenizer.encode_chat(tokenizer.render_chat(given))
        return ChatJob(private_job({"input_ids": ids}, len(ids)), "off")
    turn = _single_turn(given)
    if turn is not None:
        system, text = turn
        finding = find_documents(
            text, system=system, layouts=layouts, reorder=reorder, evidence=evidence
        )
        if finding is None and system is not None and given[0]["role"] == "system":
            # the documents in the system message (LangChain's retrieval-QA chat prompt)
            finding = find_documents(
                system, system=None, layouts=layouts, reorder=reorder, evidence=evidence, user=text
            )
        if finding is not None:
            job = segmented_job(serializer, finding.prompt, chat=True)
            return ChatJob(job, finding.outcome, finding.layout)
    job = turns_job(find_turns(tokenizer, given, None))
    return ChatJob(job, "turns", "messages") if job.head_tokens else ChatJob(job, "none")
