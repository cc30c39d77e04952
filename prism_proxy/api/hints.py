"""The optional `prism` object of a body: segment hints (SPEC §1),
`{"system", "segments": [{"id", "text"}], "suffix", "reorder", "chat"}`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from prism_proxy.api.field_types import STRICT


class SegmentHint(BaseModel):
    model_config = ConfigDict(extra="forbid", **STRICT)

    id: str
    text: str


class PrismHint(BaseModel):
    """Segment hints; omitted `system`/`suffix` come from the chat messages or prompt.

    `chat` chooses chat-template serialization; its default depends on the endpoint
    (true for chat completions, false for completions and `/generate`).
    """

    model_config = ConfigDict(extra="forbid", **STRICT)

    system: str | None = None
    segments: list[SegmentHint] = Field(default_factory=list)
    suffix: str | None = None
    reorder: bool = True
    chat: bool | None = None

    def chars(self) -> int:
        """Characters of text the hint carries (for the prompt-size limit)."""
        pieces = (self.system or "", self.suffix or "", *(s.text for s in self.segments))
        return sum(map(len, pieces))
