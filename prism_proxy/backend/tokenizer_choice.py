"""The tokenizer the proxy starts with (docs/proxy.md, "The tokenizer").

`choose_tokenizer`: a named tokenizer (`builtin` or a model directory) is checked
against the engine's own tokenization of the probes (`prism_tokens.verify`); `auto`
tries the engine's tokenizer and model directories (when readable here), then `builtin`,
and takes the first that matches. What the check found (`TokenizerState`) goes on to
`TokenizerGuard`, which repeats it when the engine may have changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Callable
from dataclasses import dataclass

from prism_proxy.backend.client import BackendClient
from prism_proxy.backend.engine_tokenizer import (
    CannotAsk,
    engine_tokenization,
    engine_tokenizer_dirs,
)
from prism_proxy.backend.errors import BackendError
from prism_tokens.tokenizer import BUILTIN, Tokenizer
from prism_tokens.verify import Tokenization, compare, tokenize_probes

AUTO = "auto"


class TokenizerState(enum.IntEnum):
    """What a check found (the value of `prism:tokenizer_verified`)."""

    UNVERIFIED = -1
    MISMATCH = 0
    MATCH = 1


class TokenizerMismatch(RuntimeError):
    """The proxy cannot start: no tokenizer it has matches the engine's."""


Loader = Callable[[str], Tokenizer]


@dataclass
class Chosen:
    """The tokenizer the proxy starts with, and its check's outcome."""

    tokenizer: Tokenizer
    ours: Tokenization
    state: TokenizerState | None
    detail: str
    engine: str


async def _load(load: Loader, spec: str) -> tuple[Tokenizer, Tokenization]:
    def work() -> tuple[Tokenizer, Tokenization]:
        tokenizer = load(spec)
        return tokenizer, tokenize_probes(tokenizer)

    return await asyncio.to_thread(work)


async def choose_tokenizer(
    spec: str, backend: BackendClient, *, forward: bool, load: Loader, timeout_s: float
) -> Chosen:
    """The tokenizer to start with: `spec` (a model directory or `builtin`) checked
    against the engine, or for `auto` the first of the engine's tokenizer and model
    directories (when readable here) and `builtin` that matches it. A mismatch raises
    `TokenizerMismatch` naming what was tried, unless `forward`."""
    if spec != AUTO:
        return await _explicit(spec, backend, forward=forward, load=load, timeout_s=timeout_s)
    try:
        dirs, engine = await engine_tokenizer_dirs(backend, timeout_s)
        theirs: Tokenization | None = await engine_tokenization(backend, timeout_s)
        cannot = ""
    except CannotAsk as exc:
        theirs, cannot = None, str(exc)
    except BackendError as exc:
        raise RuntimeError(f"--tokenizer auto: cannot ask the backend: {exc.message}") from None
    if theirs is None:
        # no check possible: only the engine's own directory is trusted
        if not dirs:
            raise TokenizerMismatch(
                f"--tokenizer auto: the engine cannot tokenize for the check ({cannot}) "
                f"and {engine} is not a directory readable here; pass --tokenizer DIR "
                "(the engine's model directory)"
            )
        tokenizer, ours = await _load(load, dirs[0])
        detail = f"the engine cannot tokenize ({cannot}); its own directory is used"
        return Chosen(tokenizer, ours, TokenizerState.UNVERIFIED, detail, engine)
    tried: list[str] = []
    fallback: tuple[Tokenizer, Tokenization] | None = None
    for candidate in [*dirs, BUILTIN]:
        try:
            tokenizer, ours = await _load(load, candidate)
        except Exception as exc:  # a directory the tokenizers library cannot read
            tried.append(f"{candidate}: cannot load ({exc})")
            continue
        verdict = compare(ours, theirs)
        if verdict.matches:
            return Chosen(tokenizer, ours, TokenizerState.MATCH, "", engine)
        tried.append(f"{candidate}: {verdict.difference}")
        fallback = fallback or (tokenizer, ours)
    detail = "; ".join(tried)
    if not forward or fallback is None:
        raise TokenizerMismatch(
            f"--tokenizer auto: no tokenizer the proxy can load matches {engine}. Tried "
            f"{detail}. Pass --tokenizer DIR (the engine's model directory, readable here), "
            "or --set tokenizer_mismatch=forward to serve requests through the engine's "
            "own endpoints"
        )
    return Chosen(*fallback, TokenizerState.MISMATCH, detail, engine)


async def _explicit(
    spec: str, backend: BackendClient, *, forward: bool, load: Loader, timeout_s: float
) -> Chosen:
    try:
        tokenizer, ours = await _load(load, spec)
    except Exception as exc:  # a missing directory, a file the library cannot read
        raise RuntimeError(f"--tokenizer {spec}: cannot load it: {exc}") from None
    engine = "the engine's tokenizer"
    with contextlib.suppress(BackendError):  # only for the messages
        _, engine = await engine_tokenizer_dirs(backend, timeout_s)
    try:
        theirs = await engine_tokenization(backend, timeout_s)
    except CannotAsk as exc:
        detail = f"the engine cannot tokenize: {exc}"
        return Chosen(tokenizer, ours, TokenizerState.UNVERIFIED, detail, engine)
    except BackendError as exc:
        detail = f"the engine did not answer the tokenizer check: {exc.message}"
        return Chosen(tokenizer, ours, None, detail, engine)
    verdict = compare(ours, theirs)
    if verdict.matches:
        return Chosen(tokenizer, ours, TokenizerState.MATCH, "", engine)
    if not forward:
        raise TokenizerMismatch(
            f"--tokenizer {spec}: tokenizer {tokenizer.name!r} does not match {engine}: "
            f"{verdict.difference}. Start without --tokenizer (auto: the engine's own), or "
            "with the engine's model directory; --set tokenizer_mismatch=forward serves "
            "requests through the engine's own endpoints instead"
        )
    return Chosen(tokenizer, ours, TokenizerState.MISMATCH, verdict.difference, engine)
