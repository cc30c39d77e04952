"""What the engine says about its tokenizer: its own tokenization of the probes
(`prism_tokens.verify`, through SGLang's `POST /v1/tokenize`), and where its tokenizer
lives (`GET /model_info`: `tokenizer_path`, `model_path`).

An engine that does not serve `/v1/tokenize` (an older SGLang, a gateway that does not
route it, a test stub: a 4xx answer, or one that is not SGLang's token lists) raises
`CannotAsk`: the check is then impossible, not failed. A 5xx or no answer is a
`BackendError`: the engine is failing or down, and the check is to be made later.
"""

from __future__ import annotations

import os
from typing import Any

from prism_proxy.backend.client import BackendClient
from prism_proxy.backend.errors import BackendAnswerError, BackendError
from prism_tokens.verify import PROBE_CHATS, PROBE_TEXTS, ChatResult, Tokenization

TOKENIZE_PATH = "/v1/tokenize"


class CannotAsk(Exception):
    """The engine cannot tokenize for the proxy; the message says why."""


def _id_list(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list) and all(type(t) is int for t in value):
        return tuple(value)
    return None


async def engine_tokenization(backend: BackendClient, timeout_s: float) -> Tokenization:
    """The engine's ids for every probe: the texts in one call (no special tokens added,
    as the proxy encodes text), each chat in its own (rendered as a chat completion
    renders it). Raises `CannotAsk`, or `BackendError` when the engine fails or is down."""
    body = {"prompt": [text for _, text in PROBE_TEXTS], "add_special_tokens": False}
    try:
        answer = await backend.post_json(TOKENIZE_PATH, body, timeout_s)
    except BackendAnswerError:
        raise CannotAsk(f"{TOKENIZE_PATH} answered something else than JSON") from None
    except BackendError as exc:
        if exc.status >= 500:  # failing or down: not asked, check again later
            raise
        raise CannotAsk(f"{TOKENIZE_PATH} answered HTTP {exc.status}: {exc.message}") from None
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    texts = [_id_list(ids) for ids in tokens] if isinstance(tokens, list) else []
    if len(texts) != len(PROBE_TEXTS) or any(ids is None for ids in texts):
        raise CannotAsk(f"{TOKENIZE_PATH} answered something else than SGLang's token lists")
    chats = []
    for _, messages in PROBE_CHATS:
        try:
            answer = await backend.post_json(TOKENIZE_PATH, {"messages": messages}, timeout_s)
        except BackendError as exc:
            if exc.status >= 500 and not isinstance(exc, BackendAnswerError):
                raise
            chats.append(ChatResult(error=f"HTTP {exc.status}: {exc.message}"))
            continue
        ids = _id_list(answer.get("tokens")) if isinstance(answer, dict) else None
        chats.append(ChatResult(ids=ids) if ids is not None else ChatResult(error="no ids"))
    return Tokenization(tuple(ids for ids in texts if ids is not None), tuple(chats))


def _tokenizer_dir(path: Any) -> str | None:
    if isinstance(path, str) and os.path.isfile(os.path.join(path, "tokenizer.json")):
        return path
    return None


async def engine_tokenizer_dirs(backend: BackendClient, timeout_s: float) -> tuple[list[str], str]:
    """The engine's tokenizer and model directories that are readable here (holding a
    `tokenizer.json`), tokenizer first; and how to name the engine's tokenizer in a
    message. BackendError when the engine does not answer `/model_info`."""
    info = await backend.get_json("/model_info", timeout_s=timeout_s)
    info = info if isinstance(info, dict) else {}
    named = [info.get("tokenizer_path"), info.get("model_path")]
    dirs: list[str] = []
    for path in named:
        found = _tokenizer_dir(path)
        if found is not None and found not in dirs:
            dirs.append(found)
    shown = next((p for p in named if isinstance(p, str) and p), None)
    return dirs, f"the engine's tokenizer {shown!r}" if shown else "the engine's tokenizer"
