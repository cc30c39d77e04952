"""Request bodies as JSON, parsed without stalling the event loop.

What a body costs to parse is not its size: orjson takes ~15 ms for 8 MB of one string
and ~700 ms for 5 MB of empty arrays, because every JSON object or array becomes a
Python object (~300-450 ns each), and neither orjson nor pydantic release the GIL, so a
worker thread would not free the loop either. So:

* a body holding at most `INLINE_CONTAINERS` objects and arrays is parsed on the loop
  (at most ~30 ms of containers, plus its scalars: 4 M integers take ~40 ms);
* a body whose brackets (`{` and `[`, counted in one pass, strings included) exceed
  that is first parsed in a worker *process*, which answers only whether it is valid
  JSON and whether it really holds more containers than allowed: more is a 413, and
  the loop never parses it; fewer (brackets inside strings) and the loop parses it;
* bodies longer than `INLINE_CONTAINERS` bytes take turns for that count and parse, one
  at a time on the loop, so a request arriving among many large ones (a `/health`
  probe) waits for one of them, not for all;
* then, before pydantic sees it, the lists that decide the cost of validating and
  handling a request (messages, content parts, tools, segments, prompt batches, stop
  strings, token-id lists, `logit_bias`) are counted against their caps (`Caps`):
  413 for the prompt's size (messages, batches), 400 for the rest.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import orjson

# Objects and arrays a body may hold; also what the loop parses inline at worst.
INLINE_CONTAINERS = 1 << 16
# Every byte but `{` and `[`: `len(data.translate(None, _NOT_OPENERS))` counts the
# openers in one pass (~0.4 ms per MB; two `bytes.count` passes took ~0.6 ms).
_NOT_OPENERS = bytes(b for b in range(256) if b not in b"{[")


class BodyError(Exception):
    """A body the proxy refuses: `status` (400 or 413), the message, the field."""

    def __init__(self, status: int, message: str, param: str = "body") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def parse_json(data: bytes) -> Any:
    """Strict JSON (orjson: UTF-8 only, no lone surrogates, no NaN/Infinity, nesting <=
    1024); BodyError(400) otherwise."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise BodyError(400, f"body: invalid JSON: {exc}") from None


def _containers(value: Any, limit: int) -> int:
    """Objects and arrays in `value`, counting stops once past `limit`."""
    count = 0
    stack = [value]
    while stack and count <= limit:
        item = stack.pop()
        if isinstance(item, dict):
            count += 1
            stack.extend(item.values())
        elif isinstance(item, list):
            count += 1
            stack.extend(item)
    return count


def check_in_worker(data: bytes, limit: int) -> tuple[int, str] | None:
    """In the worker process: None if `data` is JSON with at most `limit` containers,
    else (status, message)."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        return 400, f"body: invalid JSON: {exc}"
    if _containers(value, limit) > limit:
        return 413, f"body: more than {limit} JSON objects and arrays"
    return None


class JsonParser:
    """Parses request bodies (see the module docstring); one worker process, started on
    first need and stopped by `close()`."""

    def __init__(self, container_limit: int = INLINE_CONTAINERS) -> None:
        self.container_limit = container_limit
        self._pool: ProcessPoolExecutor | None = None
        self.checked_in_worker = 0
        self._large_turn = asyncio.Lock()

    def _worker(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn: the proxy's process has threads (uvloop, tokenizers), which fork
            # would copy in an unknown state.
            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=context)
        return self._pool

    async def parse(self, data: bytes) -> Any:
        # a body of n bytes holds at most n brackets: a short one is not counted
        if len(data) <= self.container_limit:
            return parse_json(data)
        # Large bodies take turns: the loop holds one large body's count and parse at a
        # time (~1 ms each per MB), each after a yield, so requests arriving meanwhile
        # (a /health probe) wait for one of them, not for every large body that came in
        # at once.
        async with self._large_turn:
            await asyncio.sleep(0)
            limit = self.container_limit
            if len(data.translate(None, _NOT_OPENERS)) > limit:
                self.checked_in_worker += 1
                loop = asyncio.get_running_loop()
                verdict = await loop.run_in_executor(self._worker(), check_in_worker, data, limit)
                if verdict is not None:
                    raise BodyError(*verdict)
            await asyncio.sleep(0)
            return parse_json(data)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


@dataclass(frozen=True, slots=True)
class Caps:
    """Most items in the lists of one request (the proxy's settings `max_messages`,
    `max_segments`, `max_prompt_chars`)."""

    messages: int
    segments: int
    prompt_items: int
    stop: int = 32  # SGLang's own limit
    token_ids: int = 1024  # stop_token_ids, logit_bias, token_ids_logprob


def _length(value: Any) -> int:
    return len(value) if isinstance(value, list | dict) else 0


def _sampling_lists(body: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """(field path, value) of the list fields of a body's sampling parameters, top
    level and in `sampling_params`."""
    nested = body.get("sampling_params")
    for prefix, where in (("", body), ("sampling_params.", nested)):
        if isinstance(where, Mapping):
            for name in ("stop", "stop_token_ids", "logit_bias", "token_ids_logprob"):
                if name in where:
                    yield prefix + name, where[name]


def check_counts(body: Mapping[str, Any], caps: Caps) -> None:
    """Raise BodyError when a list of `body` exceeds its cap (before validation, so a
    huge list is never validated item by item). Types are pydantic's business: a field
    of the wrong type passes here and fails there."""
    messages = body.get("messages")
    if _length(messages) > caps.messages:
        raise BodyError(
            413,
            f"messages: {len(messages)} messages exceed the limit of {caps.messages}",
            "messages",
        )
    if isinstance(messages, list):
        parts = sum(_length(m.get("content")) for m in messages if isinstance(m, dict))
        if parts > caps.messages:
            raise BodyError(
                413, f"messages: {parts} content parts exceed the limit of {caps.messages}",
                "messages",
            )  # fmt: skip
    if _length(body.get("tools")) > caps.messages:
        raise BodyError(400, f"tools: more than {caps.messages} entries", "tools")
    hint = body.get("prism")
    if isinstance(hint, dict) and _length(hint.get("segments")) > caps.segments:
        raise BodyError(
            400,
            f"prism.segments: {len(hint['segments'])} segments exceed the limit of {caps.segments}",
            "prism.segments",
        )
    for name in ("prompt", "input_ids", "text"):
        value = body.get(name)
        if isinstance(value, list):
            items = len(value)  # a batch also counts its lists' items (a flat list: no loop)
            if value and isinstance(value[0], list):
                items += sum(map(_length, value))
            if items > caps.prompt_items:
                raise BodyError(
                    413, f"{name}: {items} items exceed the limit of {caps.prompt_items}", "prompt"
                )
    for path, value in _sampling_lists(body):
        cap = caps.stop if path.endswith("stop") else caps.token_ids
        if _length(value) > cap:
            raise BodyError(400, f"{path}: more than {cap} entries", path)
