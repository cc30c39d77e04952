"""Admission at the edge: a request's rid, its token job (built off the event loop when
large), its TTFT SLO header, and `Admitted`, the one block that holds its place in QAS
and maps admission failures to answers (429 full, 503 stopping, 400 duplicate rid)."""

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
from prism_proxy.api.costs import PromptSize
from prism_proxy.backend.errors import BackendError
from prism_proxy.edge import tracing
from prism_proxy.edge.accounts import client_key, limits_of, refused
from prism_proxy.edge.errors import LANE, REFUSED_BY, ApiError, backend_failure
from prism_proxy.edge.gateway import Gateway
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


async def make_job(size: PromptSize, build: Callable[[], TokenJob]) -> TokenJob:
    """Build a request's token job (its size already checked): 400 for a bad prompt,
    off the event loop when large."""
    try:
        return await off_loop(size, build)
    except PromptError as exc:
        raise prompt_error(exc) from None


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
    """A request's place in QAS, as the one block around its way to the engine.

    Entering queues the request and waits for its release (a TTFT SLO header gives it
    its own admission deadline); a cancellation while queued withdraws it, and any exit
    after release finishes it, so no place leaks. Failures become answers: 429 when the
    queue is full (with Retry-After), 503 when stopping, 400 for a duplicate rid, and
    the backend's or the prompt's own errors raised inside the block. The request
    counts as queued for its account until its release (`edge.account_limits`: 429
    with Retry-After over its `max_queued`). A class rather
    than a generator-based context manager: it is entered once per request, and the
    generator machinery cost more than the admission itself on an idle proxy."""

    __slots__ = ("_account", "_admission", "_gateway", "_lane", "_queued", "_request")

    def __init__(
        self,
        request: web.Request,
        gateway: Gateway,
        queued: QueuedRequest,
        lane: str | None = None,
    ) -> None:
        self._request = request
        self._gateway = gateway
        self._queued = queued
        self._lane = lane
        self._admission = gateway.admission
        self._account = client_key(request)

    async def __aenter__(self) -> Released:
        request = self._request
        queued = self._queued
        slo_s = ttft_slo_s(request)
        account = self._account
        if slo_s is not None or queued.account != account:
            queued = self._queued = replace(
                queued, ttft_slo_s=slo_s or queued.ttft_slo_s, account=account
            )
        gateway = self._gateway
        usage = gateway.usage
        config = gateway.config
        refusal = usage.queue(
            account, limits_of(request, config), time.monotonic(), config.retry_after_s
        )
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
        chosen = self._lane or release.lane.value
        request[LANE] = chosen
        tracing.released(request, chosen, release.wait_s)
        metrics = gateway.metrics
        metrics.child(metrics.admission_wait, chosen).observe(release.wait_s)
        return release

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self._admission.finish(self._queued.rid)
        if exc is not None:
            self._raise_mapped(exc)

    def _raise_mapped(self, exc: BaseException) -> None:
        error = _admission_error(exc, self._gateway.config.retry_after_s)
        if isinstance(exc, QueueFullError):
            self._request[REFUSED_BY] = "max_queue"
        if error is not None:
            raise error from None
