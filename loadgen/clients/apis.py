"""How one trace request is sent to each kind of target, and how its stream is read.

* ``prism``  — OpenAI chat (``/v1/chat/completions``) with the segments in the body's
  ``prism`` object (what the ``openai`` client sends via ``extra_body``); the messages
  carry the same text concatenated, so the prompt means the same to any server.
* ``openai`` — plain OpenAI chat, what an unmodified RAG client sends: a system
  message, then the documents and the question in the user message in one of the
  `LAYOUTS` (``blank``: joined by blank lines, as LangChain's stuff-documents chain;
  ``xml``: ``<document>`` elements; ``numbered``: ``[1] ``, ``[2] `` labels in the
  client's order; ``markdown``: a ``## `` header naming each document; ``dashed``:
  LlamaIndex's default text-QA template; ``metadata``: that template with each node
  rendered as LlamaIndex's `MetadataMode.LLM` does, a ``file_path: …`` line, a blank
  line, then the text). One more chat layout, ``tool``, puts the
  documents in a retrieval tool's result instead (`CHAT_LAYOUTS`, `tool_messages`):
  the only place ContextPilot 0.5.0's server reorders text documents.
* ``sglang`` — SGLang's native ``/generate`` with the whole prompt as ``text``.
* ``native`` — SGLang's native ``/generate`` with ``input_ids``: the token ids the proxy
  sends under ``fifo`` (its serializer, the client's segment order). The no-proxy
  baselines use it, so every policy serves exactly the same prompts.

All four stream. ``StreamEvent`` is what a parsed ``data:`` line tells the replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loadgen.workloads.trace_format import TraceRequest
from prism_proxy.api.hints import PrismHint
from prism_proxy.prompts.jobs import TokenJob
from prism_proxy.prompts.plan import hinted_job
from prism_proxy.prompts.serializer import Serializer

API_NAMES = ("prism", "openai", "sglang", "native")
LAYOUTS = ("blank", "xml", "numbered", "markdown", "dashed", "metadata")  # in the user message
# More numbered styles, each documents labelled in the client's order then a blank line:
# `numbered-<style>` (the label, "{n}" the number; `own-line`: the label on a line of
# its own).
NUMBERED_STYLES = {
    "numbered": "[{n}] ",
    "numbered-paren": "({n}) ",
    "numbered-dot": "{n}. ",
    "numbered-document": "Document {n}: ",
    "numbered-document-bracket": "Document [{n}]: ",
    "numbered-source": "Source {n}: ",
    "numbered-context": "Context {n}: ",
    "numbered-own-line": "Document {n}:\n",
}
CHAT_LAYOUTS = (*LAYOUTS, *list(NUMBERED_STYLES)[1:], "tool")  # `tool`: `tool_messages`
# The retrieval step of the `tool` layout: the same call in every request (no
# arguments), so what precedes the documents is shared as the system prompt is.
RETRIEVAL_CALL = {
    "id": "call_retrieve",
    "type": "function",
    "function": {"name": "retrieve_documents", "arguments": "{}"},
}


def user_text(request: TraceRequest, layout: str = "blank") -> str:
    """The user message of plain chat: the request's documents and question in `layout`."""
    docs = [s.text for s in request.segments]
    question = request.suffix
    if layout == "blank":
        return request.joined_user_text()
    if layout == "xml":
        body = "".join(f"<document>\n{text}\n</document>\n" for text in docs)
        return f"{body}\n{question}"
    if layout in NUMBERED_STYLES:
        label = NUMBERED_STYLES[layout]
        body = "".join(
            label.replace("{n}", str(n)) + f"{text}\n\n" for n, text in enumerate(docs, 1)
        )
        return body + question
    if layout == "markdown":
        sections = "".join(f"## {segment.id}\n{segment.text}\n\n" for segment in request.segments)
        return sections + question
    if layout in ("dashed", "metadata"):
        if layout == "metadata":
            docs = [f"file_path: data/{s.id}.txt\n\n{s.text}" for s in request.segments]
        context = "\n\n".join(docs)
        return (
            "Context information is below.\n---------------------\n"
            f"{context}\n---------------------\n"
            "Given the context information and not prior knowledge, answer the query.\n"
            f"Query: {question}\nAnswer: "
        )
    known = ", ".join(c for c in CHAT_LAYOUTS if c != "tool")
    raise ValueError(f"unknown layout {layout!r}; expected one of {known}")


@dataclass(frozen=True)
class StreamEvent:
    """One parsed stream chunk: whether it carried output text, and any token counts."""

    has_content: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None


def tool_documents(request: TraceRequest) -> str:
    """The `tool` layout's tool result: the documents as ``<document>`` elements in a
    ``<documents>`` element, one per line, each stripped, in the client's order. This is
    the text ContextPilot 0.5.0 writes back after reordering
    (`contextpilot/server/intercept_parser.py` `_reconstruct_xml`), so a request it
    leaves in order reads exactly like one it reorders."""
    items = "\n".join(f"<document>{s.text.strip()}</document>" for s in request.segments)
    return f"<documents>\n{items}\n</documents>"


def tool_messages(request: TraceRequest) -> list[dict[str, Any]]:
    """The `tool` layout (agentic RAG): the system message, the assistant's retrieval
    call (`RETRIEVAL_CALL`), its result holding the documents (`tool_documents`), then
    the question as the user message. The question comes last so that the documents
    are prefix material, as in the user-message layouts."""
    system = [{"role": "system", "content": request.system}] if request.system else []
    call = {"role": "assistant", "content": "", "tool_calls": [RETRIEVAL_CALL]}
    result = {
        "role": "tool",
        "tool_call_id": RETRIEVAL_CALL["id"],
        "content": tool_documents(request),
    }
    return [*system, call, result, {"role": "user", "content": request.suffix}]


def chat_messages(request: TraceRequest, layout: str | None = None) -> list[dict[str, Any]]:
    """The chat's messages: the system message, then the user message holding the
    documents in `layout` (None: joined as hinted text is) and the question; or, for
    the `tool` layout, `tool_messages`."""
    if layout == "tool":
        return tool_messages(request)
    messages = [{"role": "system", "content": request.system}] if request.system else []
    text = request.joined_user_text() if layout is None else user_text(request, layout)
    return [*messages, {"role": "user", "content": text}]


def prism_hint(request: TraceRequest) -> dict[str, Any]:
    """The body's ``prism`` object: the request's segment hints (SPEC §1)."""
    return {
        "system": request.system,
        "segments": [{"id": s.id, "text": s.text} for s in request.segments],
        "suffix": request.suffix,
        "reorder": request.reorder,
    }


def token_job(request: TraceRequest, serializer: Serializer) -> TokenJob:
    """What the proxy makes of ``request`` sent with ``--api prism`` (chat endpoint)."""
    return hinted_job(
        serializer,
        PrismHint.model_validate(prism_hint(request)),
        system=None,
        suffix=None,
        chat=True,
    )


def client_order_ids(request: TraceRequest, serializer: Serializer) -> list[int]:
    """The token ids of ``request`` serialized in the client's segment order."""
    job = token_job(request, serializer)
    return list(job.build(job.segments).prompt_fields["input_ids"])


def build_request(
    api: str,
    request: TraceRequest,
    model: str,
    serializer: Serializer | None = None,
    layout: str = "blank",
) -> tuple[str, dict[str, Any]]:
    """The path and JSON body for ``request`` on a target speaking ``api`` (``native``
    needs the ``serializer`` of the trace's tokenizer; ``openai`` writes the documents
    in ``layout``)."""
    if api == "native":
        if serializer is None:
            raise ValueError("api 'native' needs a serializer")
        return "/generate", {
            "rid": request.rid,
            "input_ids": client_order_ids(request, serializer),
            "sampling_params": {"max_new_tokens": request.max_tokens, "temperature": 0.0},
            "stream": True,
        }
    if api == "sglang":
        return "/generate", {
            "rid": request.rid,
            "text": request.plain_prompt(),
            "sampling_params": {"max_new_tokens": request.max_tokens, "temperature": 0.0},
            "stream": True,
        }
    messages = chat_messages(request, layout if api == "openai" else None)
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": request.max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if api == "prism":
        body["prism"] = prism_hint(request)
    elif api != "openai":
        raise ValueError(f"unknown api {api!r}; expected one of {', '.join(API_NAMES)}")
    return "/v1/chat/completions", body


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) else None


def parse_event(api: str, chunk: dict[str, Any]) -> StreamEvent:
    """Read one decoded ``data:`` object of a stream."""
    if "error" in chunk:
        error = chunk["error"]
        message = error.get("message") if isinstance(error, dict) else error
        return StreamEvent(error=str(message))
    if api in ("sglang", "native"):
        meta = chunk.get("meta_info") or {}
        return StreamEvent(
            has_content=bool(chunk.get("text")),
            prompt_tokens=_int_or_none(meta.get("prompt_tokens")),
            completion_tokens=_int_or_none(meta.get("completion_tokens")),
            cached_tokens=_int_or_none(meta.get("cached_tokens")),
        )
    has_content = any(
        bool((choice.get("delta") or {}).get("content")) or bool(choice.get("text"))
        for choice in chunk.get("choices") or []
    )
    usage = chunk.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    cached = _int_or_none(details.get("cached_tokens"))
    meta = chunk.get("meta_info") or {}
    if cached is None:
        cached = _int_or_none(meta.get("cached_tokens"))
    return StreamEvent(
        has_content=has_content,
        prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
        completion_tokens=_int_or_none(usage.get("completion_tokens")),
        cached_tokens=cached,
    )
