"""The connection clock without I/O: which limit runs out when, for event
sequences a client can produce. Limits: headers 10 s, body 20 s, keep-alive 30 s,
send 5 s; times are seconds since the connection opened."""

from __future__ import annotations

import pytest

from prism_proxy.edge.clock import ConnectionClock, ConnectionLimits, Expiry

LIMITS = ConnectionLimits(header_s=10.0, body_s=20.0, keepalive_s=30.0, send_s=5.0)


def run(events: list[tuple[float, str]]) -> ConnectionClock:
    clock = ConnectionClock(LIMITS, 0.0)
    for now, event in events:
        if event == "bytes":
            clock.head_bytes(now)
        elif event == "head":
            clock.head_received(now, has_body=False)
        elif event == "head+body":
            clock.head_received(now, has_body=True)
        elif event == "body":
            clock.body_received()
        elif event == "response":
            clock.response_ended(now)
        elif event == "paused":
            clock.writing_paused(now)
        elif event == "resumed":
            clock.writing_resumed()
        else:
            raise AssertionError(event)
    return clock


# (events, the next deadline, what runs out then)
CASES = {
    # Nothing sent: the first head is due 10 s after the opening.
    "silent": ([], 10.0, Expiry.HEADERS),
    # A trickle does not move the deadline: still 10 s after the opening.
    "trickled head": ([(1.0, "bytes"), (5.0, "bytes"), (9.0, "bytes")], 10.0, Expiry.HEADERS),
    # Head at 2 s with a body: the body is due at 2 + 20 = 22 s, trickle or not.
    "slow body": ([(2.0, "head+body"), (3.0, "bytes")], 22.0, Expiry.BODY),
    # Body complete, handler working: no limit runs (a long generation is fine).
    "handler working": ([(2.0, "head+body"), (4.0, "body")], None, None),
    # Answered at 7 s: idle until 7 + 30 = 37 s.
    "idle kept alive": ([(1.0, "head"), (7.0, "response")], 37.0, Expiry.IDLE),
    # First byte of the next head at 12 s: due at 12 + 10 = 22 s (idle no longer runs).
    "next head": ([(1.0, "head"), (7.0, "response"), (12.0, "bytes")], 22.0, Expiry.HEADERS),
    # Next head's bytes came during the response (pipelined): counted from its end, 7 + 10.
    "pipelined head": ([(1.0, "head"), (3.0, "bytes"), (7.0, "response")], 17.0, Expiry.HEADERS),
    # The client stops reading at 3 s: cut at 3 + 5 = 8 s.
    "unread response": ([(1.0, "head"), (3.0, "paused")], 8.0, Expiry.SEND),
    # It read again at 6 s: nothing runs.
    "read again": ([(1.0, "head"), (3.0, "paused"), (6.0, "resumed")], None, None),
    # Unread after the response ended (its last bytes are stuck): send beats idle.
    "stuck tail": ([(1.0, "head"), (2.0, "paused"), (3.0, "response")], 7.0, Expiry.SEND),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_deadlines(case: str) -> None:
    events, deadline, expiry = CASES[case]
    clock = run(events)
    assert clock.next_deadline() == deadline
    if deadline is not None:
        assert clock.due(deadline - 0.001) is None
        assert clock.due(deadline) is expiry


def test_body_grace_gives_the_handler_its_own_deadline() -> None:
    clock = run([(2.0, "head+body")])
    assert clock.due(22.0) is Expiry.BODY
    clock.body_grace(22.0, 1.0)
    assert clock.due(22.5) is None and clock.due(23.0) is Expiry.BODY
