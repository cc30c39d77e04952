"""The deployment's rule for grammars (setting `grammars`: off, checked, on), with the
verdicts of grammars already seen remembered, bounded by count.
"""

from __future__ import annotations

import hashlib

from prism_proxy.api.grammars.ebnf import check_ebnf
from prism_proxy.api.grammars.regex import check_regex
from prism_proxy.api.grammars.rules import GrammarError

OFF_REASON = (
    "grammars other than JSON schemas are off in this deployment (setting `grammars`); "
    "one such grammar can hold every step of the engine"
)
UNCHECKED_REASON = (
    "structural tags are served only with `grammars = on` (the proxy cannot bound what "
    "matching them costs)"
)
# Verdicts remembered (clients send the same grammar again): digests only, so the
# memory is bounded by the count, not by the grammars' size.
VERDICTS = 4096


class GrammarGate:
    """Whether a grammar may reach the engine under the deployment's policy: `off` (no
    grammar but JSON schemas), `checked` (`ebnf` and `regex` of the LL(1) class), `on`
    (all, unchecked). `reason` is None for a grammar that may go, else why not."""

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self._verdicts: dict[bytes, str | None] = {}

    def known(self, kind: str, text: str) -> tuple[bool, str | None]:
        """(whether the verdict is at hand without checking, the verdict)."""
        if self.policy == "on":
            return True, None
        if self.policy == "off":
            return True, OFF_REASON
        if kind not in ("ebnf", "regex"):
            return True, UNCHECKED_REASON
        key = self._key(kind, text)
        if key in self._verdicts:
            return True, self._verdicts[key]
        return False, None

    def reason(self, kind: str, text: str) -> str | None:
        """The verdict, checking the grammar if it was not seen (costs up to a few
        hundred milliseconds for a 64 KB grammar: call it off the event loop)."""
        found, verdict = self.known(kind, text)
        if found:
            return verdict
        try:
            (check_ebnf if kind == "ebnf" else check_regex)(text)
            verdict = None
        except GrammarError as exc:
            verdict = (
                f"{exc}; only grammars whose matching costs bounded time per token are "
                "served (`grammars = checked`: LL(1), docs/proxy.md)"
            )
        except RecursionError:
            verdict = "nested too deeply to check"
        key = self._key(kind, text)
        self._verdicts[key] = verdict
        while len(self._verdicts) > VERDICTS:
            del self._verdicts[next(iter(self._verdicts))]
        return verdict

    @staticmethod
    def _key(kind: str, text: str) -> bytes:
        return hashlib.blake2b(
            f"{kind}\x00{text}".encode("utf-8", "surrogatepass"), digest_size=16
        ).digest()
