"""DART's residency summary on a real SGLang 0.5.23 server (SPEC §4).

A chat request through the proxy (documents `osse` and `bridges`) and then one sent to
`/generate` directly with its anchors in `kv_hints` (document `weir`): the proxy's
`ControlClient.fetch_residency` and `ResidencyPoller` read `GET /prism/residency` from
the plugin's control RPC in the scheduler process, first as the full set, then as a
delta naming only the new document.
"""

from __future__ import annotations

import aiohttp
import pytest
from live_support import LiveServer

from prism_proxy.backend.control import ControlClient
from prism_proxy.backend.residency_poller import ResidencyPoller
from prism_proxy.metrics import ProxyMetrics
from prism_proxy.qas.residency import ResidentSegments
from prism_wire import make_kv_hints

pytestmark = pytest.mark.sglang

DOCS = [
    {"id": "osse", "text": "The river Osse flows into the Calder Sea below the old mill."},
    {"id": "bridges", "text": "Two bridges cross the Osse, at Amble and at Rowe."},
]
SYSTEM_IDS = list(range(100, 120))
WEIR_IDS = list(range(600, 680))
PRIVATE_IDS = list(range(1500, 1510))


async def test_residency_lists_the_segments_sent_and_then_a_delta(
    live: dict[str, LiveServer], live_proxy_factory
) -> None:
    server = live["ample"]
    server.fresh()
    proxy = await live_proxy_factory(server)
    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": "Where does it flow?"}],
        "max_tokens": 2,
        "prism": {"segments": DOCS},
    }
    target = ResidentSegments()
    async with aiohttp.ClientSession() as session:
        async with session.post(proxy.url + "/v1/chat/completions", json=chat) as response:
            assert response.status == 200, await response.text()
        metrics = ProxyMetrics.create()
        client = ControlClient(
            session, server.control_url, token=server.token, protect=8, metrics=metrics
        )
        poller = ResidencyPoller(client, target)
        assert await poller.poll_once()
        assert target.resident() == {"osse", "bridges"}
        held = target.version
        assert held is not None and held >= 2

        ids = SYSTEM_IDS + WEIR_IDS + PRIVATE_IDS
        anchors = [  # a system anchor without an id: the older form, still read
            {"kind": "system", "segment_id": None, "offset": len(SYSTEM_IDS)},
            {"kind": "segment", "segment_id": "weir", "offset": len(SYSTEM_IDS + WEIR_IDS)},
            {"kind": "private", "segment_id": None, "offset": len(ids)},
        ]
        server.generate(ids, kv_hints=make_kv_hints(anchors, {}, message_id="weir1"))

        delta = await client.fetch_residency(target.generation, held)
        assert delta is not None and not delta.full
        assert delta.resident == ("weir",) and delta.gone == () and delta.version == held + 1
        assert await poller.poll_once()
        assert target.resident() == {"osse", "bridges", "weir"}
    stats = server.stats()
    # heads (the proxy's chat head and the id-less one) are never reported as segments
    assert stats["segments_resident"] == 3 and stats["residency_version"] == held + 1
