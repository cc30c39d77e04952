"""Admission at the edge: a request's rid, its token job (built off the event loop when
large), its TTFT SLO header, and `Admitted`, the one block that holds its place in QAS,
maps admission failures to answers (429 full, 503 stopping, 400 duplicate rid) and
carries the events of its answer (first token, tool call, finish) to admission, the
trace, the metrics, its account and the session table."""

from __future__ import annotations

import asyncio
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from aiohttp import web

from prism_proxy.admission.driver import (
    DuplicateRidError,
    QueueFullError,
    Released,
    ShuttingDownError,
)
from prism_proxy.admission.session_keeper import SessionKeeper
from prism_proxy.api.costs import PromptSize
from prism_proxy.backend.errors import BackendError
from prism_proxy.edge import tracing
from prism_proxy.edge.account_metrics import count_tokens
from prism_proxy.edge.accounts import limits_of, refused
from prism_proxy.edge.errors import LANE, REFUSED_BY, STARTED, ApiError, backend_failure
from prism_proxy.edge.gateway import Gateway
from prism_proxy.edge.openai_format import TokenUsage
from prism_proxy.memory import release_free_memory
from prism_proxy.prompts.jobs import PromptError, TokenJob
from prism_proxy.qas.types import QueuedRequest

T = TypeVar("T")


def new_rid() -> str:
    """The backend rid of one request: always the proxy's own, fixed length.

    SGLang aborts every request whose rid *starts with* the aborted one, so a rid chosen
    by a client could abort other clients' requests; a client's `rid` only names its
    response.
    """
    return "prism-" + os.urandom(16).hex()  # uuid4().hex costs 4x as much


def prompt_error(exc: PromptError) -> ApiError:
    """The 400 of a prompt the proxy cannot serve, naming its field."""
    return ApiError(400, str(exc), param=exc.param)


# Requests whose prompt work (`PromptSize.work`) is at least this large are rendered,
# tokenized and serialized in a worker thread (the tokenizer releases the GIL for long
# texts, and the interpreter switches threads every 5 ms in Python code such as the
# chat template), so one big request never stalls the loop.
OFFLOAD_CHARS = 32_768


def _then_release(work: Callable[[], T]) -> T:
    """`work()`, then the heap's free pages back to the OS, in the worker thread: the
    trim (ctypes releases the GIL) never holds the event loop."""
    try:
        return work()
    finally:
        release_free_memory()


async def off_loop(size: PromptSize, work: Callable[[], T]) -> T:
    """`work()` here for a small prompt, in a worker thread for a large one."""
    if size.work >= OFFLOAD_CHARS:
        return await asyncio.to_thread(_then_release, work)
    return work()


SLO_HEADER = "x-prism-ttft-slo-ms"


MAX_SLO_MS = 3_600_000.0


# Plain decimal milliseconds: Python's float() also takes "1_000", " 1e3", "inf", "nan".
_SLO_VALUE = re.compile(r"[0-9]{1,7}(?:\.[0-9]{1,3})?")


def ttft_slo_s(request: web.Request) -> float | None:
    """The client's TTFT target from `x-prism-ttft-slo-ms` (None when absent; 400 when
    not plain decimal milliseconds in (0, 1 h])."""
    raw = request.headers.get(SLO_HEADER)
    if raw is None:
        return None
    value = float(raw) if _SLO_VALUE.fullmatch(raw) else math.nan
    if not 0.0 < value <= MAX_SLO_MS:  # also refuses NaN
        raise ApiError(
            400,
            f"{SLO_HEADER}: expected decimal milliseconds in (0, {MAX_SLO_MS:.0f}]",
            param=SLO_HEADER,
        )
    return value / 1000.0


def _admission_error(exc: BaseException, retry_after_s: float) -> ApiError | None:
    """The answer to an admission failure, or to a backend failure inside the block."""
    if isinstance(exc, QueueFullError):
        headers = {"Retry-After": str(retry_after_s)}
        return ApiError(429, str(exc), kind="rate_limit_exceeded", headers=headers)
    if isinstance(exc, ShuttingDownError):
        return ApiError(503, str(exc), kind="service_unavailable")
    if isinstance(exc, DuplicateRidError):
        return ApiError(400, f"rid: {exc}", param="rid")
    if isinstance(exc, BackendError):
        return backend_failure(exc)
    if isinstance(exc, PromptError):  # found only when serialized at release
        return prompt_error(exc)
    return None


class Admitted:
    """One admitted request's life at the edge, as the one block around its way to the
    engine: who sent it (`client`, its `accounts.client_key`, computed once by the
    handler and carried), its place in QAS, and, for a chat with tools, its session in
    the proxy's `SessionKeeper` (`keeper`; None without one). The handlers tell this
    object the events of the answer (`first_token`, `tool_call`, `finish`) and it tells
    admission, the trace, the metrics, the account and the session table, each once.

    Entering tells the keeper the request arrived (a continuation of a paused session
    is queued with its program's start), queues the request and waits for its release
    (a TTFT SLO header gives it its own admission deadline); a cancellation while
    queued withdraws it, and any exit after release finishes it, so no place leaks. A
    request that leaves without `finish` (a failure, a broken stream, a client gone) is
    forgotten by the keeper: no pause follows a broken answer. Failures become answers:
    429 when the queue is full (with Retry-After), 503 when stopping, 400 for a
    duplicate rid, and the backend's or the prompt's own errors raised inside the block.
    The request counts as queued for its account until its release
    (`edge.account_limits`: 429 with Retry-After over its `max_queued`). A class rather
    than a generator-based context manager: it is entered once per request, and the
    generator machinery cost more than the admission itself on an idle proxy."""

    __slots__ = (
        "_admission", "_ended", "_first", "_gateway", "_job", "_keeper", "_limits", "_open",
        "_queued", "_request", "_uncached_told", "_watching", "client", "lane",
    )  # fmt: skip

    def __init__(
        self,
        request: web.Request,
        gateway: Gateway,
        queued: QueuedRequest,
        client: str,
        *,
        lane: str | None = None,
        keeper: SessionKeeper | None = None,
        job: TokenJob | None = None,
    ) -> None:
        self._request = request
        self._gateway = gateway
        self._queued = queued
        self.client = client
        self.lane = lane  # the lane asked for; once released, the lane it runs in
        self._admission = gateway.admission
        self._keeper = keeper  # with the `job` whose turns it follows
        self._job = job
        self._first = False  # the first token was told
        self._uncached_told = False  # its uncached prompt tokens reached the B rule
        self._ended = False  # the answer's end was told
        self._watching = keeper is not None  # the keeper awaits a tool call
        self._open = False  # the keeper holds the session, neither finished nor forgotten

    @property
    def rid(self) -> str:
        return self._queued.rid

    @property
    def sessions(self) -> bool:
        """Whether the session keeper follows this request (its tool calls matter)."""
        return self._keeper is not None

    async def __aenter__(self) -> Released:
        # one frame, not a helper coroutine: every resumption of the request's task
        # walks its await chain
        try:
            if self._keeper is not None:
                self._arrive(self._keeper)
            request = self._request
            queued = self._queued
            slo_s = ttft_slo_s(request)
            account = self.client
            if slo_s is not None or queued.account != account:
                queued = self._queued = replace(
                    queued, ttft_slo_s=slo_s or queued.ttft_slo_s, account=account
                )
            gateway = self._gateway
            usage = gateway.usage
            config = gateway.config
            limits = self._limits = limits_of(request, config)
            refusal = usage.queue(account, limits, time.monotonic(), config.retry_after_s)
            if refusal is not None:
                raise refused(request, refusal)
            admission = self._admission
            tracing.queued(request)
            try:
                future = admission.admit(queued)
            except Exception as exc:
                usage.unqueue(account, time.monotonic())
                self._raise_mapped(exc)
                raise
            try:
                release = await future
            except asyncio.CancelledError:
                if future.done() and not future.cancelled():
                    admission.finish(queued.rid)  # released just as the client left
                else:
                    admission.withdraw(queued.rid)
                usage.unqueue(account, time.monotonic())
                raise
            except BaseException as exc:
                admission.withdraw(queued.rid)
                usage.unqueue(account, time.monotonic())
                self._raise_mapped(exc)
                raise
            usage.unqueue(account, time.monotonic())
            chosen = self.lane = self.lane or release.lane.value
            request[LANE] = chosen
            tracing.released(request, chosen, release.wait_s)
            metrics = gateway.metrics
            metrics.child(metrics.admission_wait, chosen).observe(release.wait_s)
            return release
        except BaseException:
            self._forget()  # a request refused or withdrawn leaves no session behind
            raise

    def _arrive(self, keeper: SessionKeeper) -> None:
        """Tell the keeper a chat with tools arrived; mark a continuation with its
        program's start."""
        job = self._job
        assert job is not None
        queued = self._queued
        self._open = True
        tokens = len(job.build(()).prompt_fields.get("input_ids", ())) - job.head_tokens
        start = keeper.arrive(queued.rid, job.segments, job.prefix_key, tokens, self.client)
        metrics = self._gateway.metrics
        metrics.child(metrics.session_calls, "new" if start is None else "continued").inc()
        if start is not None:
            self._queued = replace(queued, program_start=start)

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self._admission.finish(self._queued.rid)
        self._forget()
        if exc is not None:
            self._raise_mapped(exc)

    def _raise_mapped(self, exc: BaseException) -> None:
        error = _admission_error(exc, self._gateway.config.retry_after_s)
        if isinstance(exc, QueueFullError):
            self._request[REFUSED_BY] = "max_queue"
        if error is not None:
            raise error from None

    # --- the answer's events ------------------------------------------------------------
    def unseen_first_token(self) -> None:
        """A request whose first token cannot be seen takes no place in prefill pacing."""
        self._admission.first_token(self._queued.rid)

    def first_token(self, uncached: int | None = None, *, timed: bool = True) -> None:
        """The engine's first chunk (or whole answer) arrived: the request leaves
        pending prefill (`uncached`: its prompt tokens the engine did not find cached),
        the trace and the keeper are told, TTFT is observed when `timed`. Once."""
        if self._first:
            return
        self._first = True
        rid = self._queued.rid
        self._uncached_told = uncached is not None
        self._admission.first_token(rid, uncached)
        request = self._request
        tracing.first_token(request)
        if timed:
            metrics = self._gateway.metrics
            metrics.child(metrics.ttft, self.lane).observe(time.monotonic() - request[STARTED])
        if self._keeper is not None:
            self._keeper.started(rid)

    def tool_call(self, names: tuple[str, ...]) -> None:
        """The answer is becoming a call of the tools `names` (told once, when named)."""
        if self._watching and names and self._open:
            self._watching = False
            assert self._keeper is not None
            self._keeper.calling(self._queued.rid, names)

    def finish(
        self, usage: TokenUsage | None, called: bool = False, names: tuple[str, ...] = ()
    ) -> None:
        """The answer ended (in a call of the tools `names` when `called`): the keeper
        is told how, and its tokens are counted (`usage`, when the engine gave them).
        Once."""
        if self._ended:
            return
        self._ended = True
        if self._open:
            self._open = False
            assert self._keeper is not None
            self._keeper.finish(self._queued.rid, called, names)
        if usage is None:
            return
        if not self._uncached_told and usage.cached_known:  # the engine's endpoint: now
            self._uncached_told = True
            self._admission.observe_uncached(usage.prompt_tokens - usage.cached_tokens)
        request = self._request
        gateway = self._gateway
        tracing.tokens(request, usage.prompt_tokens, usage.completion_tokens)
        metrics = gateway.metrics
        lane = self.lane
        metrics.child(metrics.prompt_tokens, lane).inc(usage.prompt_tokens)
        metrics.child(metrics.cached_tokens, lane).inc(usage.cached_tokens)
        tokens_per_minute = self._limits.tokens_per_minute
        if tokens_per_minute:  # what the answer used, charged to its client
            tokens = usage.prompt_tokens + usage.completion_tokens
            gateway.usage.charge(self.client, tokens, tokens_per_minute, time.monotonic())
        count_tokens(request, metrics, gateway.keys is not None, usage)

    def _forget(self) -> None:
        if self._open:
            self._open = False
            assert self._keeper is not None
            self._keeper.forget(self._queued.rid)
