"""The proxy knows the engine's tokenizer, or keeps its token path shut.

The token path sends the engine token ids the proxy made; with another vocabulary or
another chat template the engine would answer a prompt the client never wrote. So the
proxy's tokenizer is checked against the engine's own tokenization of probe texts and
chats (`prism_tokens.verify`), at start (`tokenizer_choice.choose_tokenizer`) and again whenever the
engine may have changed (`TokenizerGuard.refresh`: it went down, or its `/server_info`
`startup_time` changed). The token path is open while the latest check matched, or
could not be made because the engine cannot tokenize (`unverified`, only for a
tokenizer the operator named or the engine's own model directory).

States (`prism:tokenizer_verified`): 1 match, 0 mismatch, -1 unverified or not checked
against the engine that runs now (then the engine was unreachable: a request that needs
the token path asks again first). Every change is logged. docs/proxy.md, "The tokenizer".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass
from typing import Any

from prism_proxy.backend.client import BackendClient
from prism_proxy.backend.engine_tokenizer import CannotAsk, engine_tokenization
from prism_proxy.backend.errors import BackendError
from prism_proxy.backend.tokenizer_choice import Loader, TokenizerState, choose_tokenizer
from prism_proxy.metrics import ProxyMetrics
from prism_tokens.tokenizer import BUILTIN, Tokenizer
from prism_tokens.verify import Tokenization, compare, tokenize_probes

log = logging.getLogger(__name__)

_UNSEEN = object()  # no server info at hand: the engine's startup time is not known


def tokenizer_label(name: str) -> str:
    """How metrics name a tokenizer: `builtin` or its directory's last component (never
    a path: /metrics may be on the client port)."""
    return name if name == BUILTIN else os.path.basename(os.path.normpath(name)) or name


@dataclass
class TokenizerCheck:
    """The latest check of the proxy's tokenizer against the engine (no I/O).

    `state` None: not checked against the engine running now (it was unreachable).
    `downs` and `startup_time`: the backend's down count and the engine's start time
    when the check was made; when either moves, the check is stale."""

    state: TokenizerState | None = None
    detail: str = ""
    downs: int = -1
    startup_time: Any = None

    @property
    def open(self) -> bool:
        """Whether the token path may send the proxy's ids."""
        return self.state in (TokenizerState.MATCH, TokenizerState.UNVERIFIED)

    def stale(self, downs: int, startup_time: Any = _UNSEEN) -> bool:
        if self.state is None or downs != self.downs:
            return True
        return startup_time is not _UNSEEN and startup_time != self.startup_time

    def record(
        self, state: TokenizerState | None, detail: str, downs: int, startup_time: Any
    ) -> bool:
        """Store a check's outcome; True when the state or its reason changed."""
        changed = (state, detail) != (self.state, self.detail)
        self.state, self.detail = state, detail
        self.downs, self.startup_time = downs, startup_time
        return changed


def _startup_time(info: Any) -> Any:
    return info.get("startup_time") if isinstance(info, dict) else None


class TokenizerGuard:
    """The check of one tokenizer against the engine, repeated when stale; one at a
    time (concurrent callers share it). `forward`: on a mismatch, requests that need the
    token path go to the engine's own endpoints (else they get 503)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        backend: BackendClient,
        *,
        forward: bool,
        metrics: ProxyMetrics,
        timeout_s: float,
        ours: Tokenization | None = None,
        engine: str = "the engine's tokenizer",
    ) -> None:
        self.tokenizer = tokenizer
        self.backend = backend
        self.forward = forward
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.ours = ours if ours is not None else tokenize_probes(tokenizer)
        self.engine = engine
        self.label = tokenizer_label(tokenizer.name)
        self.check = TokenizerCheck()
        self._failure = BackendError(502, "backend unreachable")  # the last check's, if any
        self._running: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls,
        spec: str,
        backend: BackendClient,
        *,
        forward: bool,
        metrics: ProxyMetrics,
        load: Loader,
        timeout_s: float,
    ) -> TokenizerGuard:
        """The proxy's tokenizer chosen and checked at start (`choose_tokenizer`; a
        mismatch raises `TokenizerMismatch` unless `forward`), with the engine's
        startup time, so that a restart is seen."""
        downs = backend.downs
        info = await backend.probe()
        chosen = await choose_tokenizer(
            spec, backend, forward=forward, load=load, timeout_s=timeout_s
        )
        guard = cls(
            chosen.tokenizer,
            backend,
            forward=forward,
            metrics=metrics,
            timeout_s=timeout_s,
            ours=chosen.ours,
            engine=chosen.engine,
        )
        started = _startup_time(info) if chosen.state is not None else None
        guard.apply(chosen.state, chosen.detail, downs, started)
        return guard

    # --- what the edge asks -----------------------------------------------------------
    @property
    def vocab_size(self) -> int | None:
        """The vocabulary client token ids are checked against; None after a mismatch
        (the engine's is not known then)."""
        if self.check.state is TokenizerState.MISMATCH:
            return None
        return self.tokenizer.vocab_size

    def refusal(self) -> str:
        """Why the token path is shut, for a client's 503 (no paths: the label)."""
        return (
            f"the proxy's tokenizer {self.label!r} does not match the engine's; requests "
            "that need it are refused while they differ"
        )

    async def token_path(self) -> bool:
        """Whether a request may take the token path now (checked again first when
        stale). BackendError when the engine could not be asked (it is down)."""
        await self.refresh()
        check = self.check
        if check.state is None:
            raise BackendError(self._failure.status, self._failure.message)
        return check.open

    async def close(self) -> None:
        """Stop a check still running (shutdown: the backend's session closes next)."""
        running = self._running
        if running is not None and not running.done():
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running

    # --- checks --------------------------------------------------------------------------
    async def refresh(self, server_info: dict[str, Any] | None = None) -> None:
        """Check again if the engine may have changed since the last check: it went down
        since, or `server_info` (from the health probe) shows another startup time."""
        seen = _UNSEEN if server_info is None else _startup_time(server_info)
        if not self.check.stale(self.backend.downs, seen):
            return
        running = self._running
        if running is None or running.done():
            running = self._running = asyncio.create_task(
                self._check(server_info), name="prism-tokenizer-check"
            )
        # shielded: a client that leaves does not cancel the check the others wait for
        await asyncio.shield(running)

    async def _check(self, server_info: dict[str, Any] | None) -> None:
        downs = self.backend.downs  # before asking: a failure meanwhile leaves it stale
        try:
            if server_info is None:
                server_info = await self._server_info()
            started = _startup_time(server_info)
            check = self.check
            if check.state is not None and started is not None and started == check.startup_time:
                # the same engine process, only unreachable for a while: same tokenizer
                self.apply(check.state, check.detail, downs, started)
                return
            self.apply(*await self._ask(), downs, started)
        except BackendError as exc:
            self._failure = exc
            detail = f"the engine did not answer the tokenizer check: {exc.message}"
            self.apply(None, detail, downs, None)

    async def _server_info(self) -> Any:
        """The engine's server info; {} when it has none (a 4xx: a gateway, a stub)."""
        try:
            return await self.backend.get_json("/server_info", self.timeout_s)
        except BackendError as exc:
            if exc.status >= 500:
                raise
            return {}

    async def _ask(self) -> tuple[TokenizerState, str]:
        try:
            theirs = await engine_tokenization(self.backend, self.timeout_s)
        except CannotAsk as exc:
            return TokenizerState.UNVERIFIED, f"the engine cannot tokenize: {exc}"
        verdict = compare(self.ours, theirs)
        if verdict.matches:
            return TokenizerState.MATCH, ""
        return TokenizerState.MISMATCH, verdict.difference

    def apply(
        self, state: TokenizerState | None, detail: str, downs: int, startup_time: Any
    ) -> None:
        """Record a check's outcome: metric, and a log line when it changed."""
        changed = self.check.record(state, detail, downs, startup_time)
        value = TokenizerState.UNVERIFIED if state is None else state
        self.metrics.tokenizer_verified.labels(self.label).set(int(value))
        self.metrics.token_path_open.set(1 if self.check.open else 0)
        if changed:
            log_change(self.tokenizer.name, self.engine, state, detail, self.forward)


def log_change(
    name: str, engine: str, state: TokenizerState | None, detail: str, forward: bool
) -> None:
    if state is TokenizerState.MATCH:
        log.info("tokenizer %s matches %s (probe texts and chats): token path on", name, engine)
    elif state is TokenizerState.UNVERIFIED:
        log.warning("tokenizer %s is used unverified: %s", name, detail)
    elif state is TokenizerState.MISMATCH:
        action = (
            "token path off, chats forwarded to the engine's own endpoints"
            if forward
            else "token path off, its requests refused (503)"
        )
        log.error("tokenizer %s does not match %s: %s; %s", name, engine, detail, action)
    else:
        log.warning("tokenizer %s not checked yet: %s", name, detail)
