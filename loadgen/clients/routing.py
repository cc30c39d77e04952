"""The routing key of a request, for a gateway in front of several PRISM replicas
(docs/scale-out.md).

sgl-model-gateway (`smg --policy consistent_hashing`, or `manual`) routes by the
`X-SMG-Routing-Key` header. Requests that share their anchor segment then reach the
same replica, whose cache and QAS see all of them. The anchor is:

* the request's most popular segment, when the client knows popularity (its own
  retrieval counts, or a hot-document list);
* otherwise the segment that PRISM's canonical order puts first (`canonical_key`).
  A lone request at light load is serialized with it first, so two requests holding it
  share at least the system prompt and that segment on the replica they reach.

    from loadgen.clients.routing import routing_headers
    client.chat.completions.create(..., extra_body={"prism": hint},
                                   extra_headers=routing_headers(segment_ids))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prism_proxy.qas.alignment import canonical_key

ROUTING_KEY_HEADER = "X-SMG-Routing-Key"
# What `replay --routing-key` sends (`loadgen.clients.replay`).
ROUTING_KEYS = ("none", "canonical", "anchor", "anchor-bounded")


def anchor_segment(
    segment_ids: Sequence[str], popularity: Mapping[str, float] | None = None
) -> str | None:
    """The segment to route by; None when the request has no segments. Ties of
    popularity break by the canonical order, so every client picks the same one."""
    if not segment_ids:
        return None
    if popularity:
        return min(segment_ids, key=lambda s: (-popularity.get(s, 0.0), canonical_key(s)))
    return min(segment_ids, key=canonical_key)


def routing_headers(
    segment_ids: Sequence[str], popularity: Mapping[str, float] | None = None
) -> dict[str, str]:
    """`{"X-SMG-Routing-Key": anchor}`, or no header for a request without segments."""
    anchor = anchor_segment(segment_ids, popularity)
    return {} if anchor is None else {ROUTING_KEY_HEADER: anchor}
