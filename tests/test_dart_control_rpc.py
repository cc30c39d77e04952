"""DART's control RPC over real HTTP on loopback (SPEC §4): auth, epochs, malformed
bodies, stats and Prometheus metrics; in-process aiohttp on port 0 and the background
thread the SGLang scheduler process uses."""

from __future__ import annotations

import math

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backend_plugin.config import ControlConfig, ControlConfigError, load_config
from backend_plugin.control_rpc import ControlThread, start_control_site
from backend_plugin.dart import DartCore, NodeMeta
from prism_wire import (
    MAX_OWNER_CHARS,
    MAX_RETAIN_TTL_S,
    MAX_RETAINED,
    NO_RETENTION,
    AnchorKind,
    Retention,
    system_owner,
)

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def rpc():
    core = DartCore(protect=8)
    runner, port = await start_control_site(core, ControlConfig(port=0, token=TOKEN))
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        yield core, client
    await runner.cleanup()


async def test_requires_the_bearer_token_except_for_health(rpc):
    _, client = rpc
    body = {"epoch": 1, "table": {"A": 1.0}, "protect": 2}
    assert (await client.post("/prism/priorities", json=body)).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert (await client.post("/prism/priorities", json=body, headers=wrong)).status_code == 401
    basic = {"Authorization": f"Basic {TOKEN}"}
    assert (await client.get("/prism/stats", headers=basic)).status_code == 401
    for path in ("/prism/stats", "/prism/metrics"):
        assert (await client.get(path)).status_code == 401
    assert (await client.post("/prism/reset")).status_code == 401
    health = await client.get("/prism/health")
    assert health.status_code == 200 and health.json() == {"status": "ok"}


async def test_epochs_must_increase_and_updates_apply_at_the_owners_drain(rpc):
    core, client = rpc
    ok = await client.post(
        "/prism/priorities", json={"epoch": 3, "table": {"A": 5, "B": 1.5}}, headers=AUTH
    )
    assert ok.status_code == 200 and ok.json() == {"accepted": True, "epoch": 3}
    for stale in (3, 2):
        r = await client.post(
            "/prism/priorities", json={"epoch": stale, "table": {}, "protect": 1}, headers=AUTH
        )
        assert r.status_code == 409
        assert r.json()["current_epoch"] == 3
    stats = (await client.get("/prism/stats", headers=AUTH)).json()
    assert stats["accepted_epoch"] == 3 and stats["epoch"] is None  # queued, not applied yet
    core.apply_pending()  # what the scheduler thread does between tree operations
    stats = (await client.get("/prism/stats", headers=AUTH)).json()
    assert stats["epoch"] == 3 and stats["table_size"] == 2 and stats["protect"] == 8
    assert core.table == {"A": 5.0, "B": 1.5}
    r = await client.post("/prism/reset", headers=AUTH)
    assert r.status_code == 200
    core.apply_pending()
    assert core.table is None
    r = await client.post("/prism/priorities", json={"epoch": 1, "table": {}}, headers=AUTH)
    assert r.status_code == 200  # a reset restarts the epochs


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"table": {"A": 1}}',
        b'{"epoch": 1}',
        b'{"epoch": "1", "table": {}}',
        b'{"epoch": -1, "table": {}}',
        b'{"epoch": 1, "table": {"A": "high"}}',
        b'{"epoch": 1, "table": {"A": NaN}}',
        b'{"epoch": 1, "table": {}, "protect": -2}',
        b'{"epoch": 1, "table": {}, "extra": true}',
    ],
)
async def test_malformed_updates_get_400_and_change_nothing(rpc, body):
    core, client = rpc
    r = await client.post("/prism/priorities", content=body, headers=AUTH)
    assert r.status_code == 400
    assert core.inbox.accepted_epoch is None and core.inbox.drain() == []


async def test_retain_orders_after_unretained_and_expires(rpc):
    core, client = rpc
    now = [100.0]
    core.clock = lambda: now[0]
    r = await client.post(
        "/prism/retain", json={"retain": {"A": [-1.0, 5.0], "B": [-2.0, 50.0]}}, headers=AUTH
    )
    assert r.status_code == 200
    core.apply_pending()
    a, b, c, d = (NodeMeta(AnchorKind.SEGMENT, x, True) for x in "ABCD")
    assert core.key(c, 9.0) < core.key(b, 1.0) < core.key(a, 1.0)  # retained last, by score
    now[0] = 106.0  # A's TTL has run out: an eviction pass forgets it
    core.begin_eviction()
    assert core.key(a, 1.0) == (0, 0.0, 1.0) and set(core.retained) == {"B"}
    # R_t holds at most retain_fraction x the pool in path tokens, highest scores first:
    # of C (600 tokens, score 5) and D (500, score 4) in a 1,000-token pool at 0.75, only C
    core.set_capacity(1000)
    body = {"retain": {"C": [5.0, 50.0, 600], "D": [4.0, 50.0, 500]}, "release": ["B"]}
    r = await client.post("/prism/retain", json=body, headers=AUTH)
    core.apply_pending()
    assert set(core.retained) == {"C"} and core.key(d, 1.0) == (0, 0.0, 1.0)
    assert core.stats().retain_entries == 2
    core.set_capacity(None)
    r = await client.post("/prism/retain", json={"release": ["C", "D"]}, headers=AUTH)
    core.apply_pending()
    assert r.status_code == 200 and not core.retained
    for bad in (
        {"retain": {"A": [1.0]}},  # not [score, ttl(, tokens)]
        {"retain": {"A": [1.0, 1.0, -5]}},  # negative tokens
        {"retain": {"A": [1.0, 1.0, -0.5]}},  # checked before a float count is cut to int
        {"release": [str(n) for n in range(MAX_RETAINED + 1)]},  # too many owners
        {"retain": {"A": [1.0, -1.0]}},  # negative ttl
        {"retain": {"A": [1.0, 1e9]}},  # past MAX_RETAIN_TTL_S
        {"retain": {"x" * 300: [1.0, 1.0]}},  # an id too long
        {"keep": {}},  # unknown field
    ):
        r = await client.post("/prism/retain", json=bad, headers=AUTH)
        assert r.status_code == 400, bad
    r = await client.post("/prism/retain", json={"retain": {}})
    assert r.status_code == 401


def test_a_retention_is_its_rpc_body_and_checks_its_bounds() -> None:
    retention = Retention({"A": (1.0, 60.0, 500), "B": (2.0, 5.0, None)}, ("C",), ("D",))
    body = {"retain": {"A": [1.0, 60.0, 500], "B": [2.0, 5.0]}, "release": ["C"], "discard": ["D"]}
    assert retention.as_dict() == body
    assert Retention.from_json(orjson.dumps(body)) == retention
    # the later word about an owner wins; the empty word changes nothing
    later = Retention(release=("A",))
    assert retention + later == Retention({"B": (2.0, 5.0, None)}, ("C", "A"), ("D",))
    assert retention + NO_RETENTION is retention and not NO_RETENTION
    for bad in (
        {"A": (math.inf, 1.0, None)},
        {"A": (1.0, -1.0, None)},
        {"A": (1.0, MAX_RETAIN_TTL_S + 1, None)},
        {"A": (1.0, math.nan, None)},
        {"A": (1.0, 1.0, -1)},
        {"A": (1.0, 1.0, 2**40 + 1)},
        {"x" * (MAX_OWNER_CHARS + 1): (1.0, 1.0, None)},
    ):
        with pytest.raises(ValueError):
            Retention(bad)
    # how many owners one body names is the wire's bound: words combine past it
    many = tuple(str(n) for n in range(MAX_RETAINED + 1))
    assert len((Retention(discard=many[:-1]) + Retention(discard=many[-1:])).discard) == len(many)
    with pytest.raises(ValueError):
        Retention.from_json(orjson.dumps({"discard": list(many)}))


async def test_stats_and_metrics_report_evictions_by_class(rpc):
    core, client = rpc
    seg = NodeMeta(AnchorKind.SEGMENT, "A", True)
    core.on_assign(None, seg, 6)
    core.on_assign(None, NodeMeta(AnchorKind.SEGMENT, "B", True), 5)
    core.on_assign(None, NodeMeta(AnchorKind.PRIVATE, None, True), 4)
    r = await client.post(
        "/prism/priorities",
        json={"epoch": 7, "table": {"A": 2, "B": 1}, "protect": 1},
        headers=AUTH,
    )
    assert r.status_code == 200
    core.apply_pending()
    core.on_evicted(NodeMeta(AnchorKind.PRIVATE, None, True), 4)
    core.on_evicted(None, 3)
    core.on_evicted(NodeMeta(AnchorKind.SEGMENT, "B", True), 5)
    stats = (await client.get("/prism/stats", headers=AUTH)).json()
    assert stats["evicted_tokens"] == {"private": 7, "segment": 5, "protected": 0, "retained": 0}
    assert stats["protected_segments"] == ["A"] and stats["protected_tokens"] == 6
    assert stats["anchors_resident"] == 1
    r = await client.get("/prism/metrics", headers=AUTH)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, s.labels.get("class")): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }
    assert samples[("prism:dart_evicted_tokens_total", "private")] == 7
    assert samples[("prism:dart_evicted_tokens_total", "segment")] == 5
    assert samples[("prism:dart_evicted_tokens_total", "protected")] == 0
    assert samples[("prism:dart_protected_tokens", None)] == 6
    assert samples[("prism:dart_protect_cap_tokens", None)] == -1  # capacity unknown
    assert samples[("prism:dart_anchors_resident", None)] == 1
    assert samples[("prism:dart_priority_epoch", None)] == 7


async def test_metrics_count_retention_lost_over_the_cap_and_retention_too_late(rpc):
    """A pool of 100 tokens: R_t holds 75 path tokens, so of A (score 2) and B (score 1),
    60 path tokens each, only A is in R_t; B's 5 resident tokens evicted count as over
    the cap (and as a segment's). A retention for Z, which has nothing resident, comes
    too late."""
    core, client = rpc
    core.set_capacity(100)
    core.on_assign(None, NodeMeta(AnchorKind.SEGMENT, "A", True), 6)
    core.on_assign(None, NodeMeta(AnchorKind.SEGMENT, "B", True), 5)
    core.inbox.submit_retain(
        Retention({"A": (2.0, 60.0, 60), "B": (1.0, 60.0, 60), "Z": (3.0, 60.0, 10)})
    )
    core.apply_pending()
    assert set(core.retained) == {"A", "Z"}
    core.on_evicted(NodeMeta(AnchorKind.SEGMENT, "B", True), 5)
    stats = (await client.get("/prism/stats", headers=AUTH)).json()
    assert stats["over_cap_evicted_tokens"] == 5 and stats["late_retentions"] == 1
    assert stats["evicted_tokens"]["segment"] == 5
    r = await client.get("/prism/metrics", headers=AUTH)
    samples = {s.name: s.value for f in text_string_to_metric_families(r.text) for s in f.samples}
    assert samples["prism:dart_over_cap_evicted_tokens_total"] == 5
    assert samples["prism:dart_late_retentions_total"] == 1


async def test_a_host_tier_counts_demotions_and_keeps_a_demoted_retention(rpc):
    """Without a host tier nothing about one is reported. With it, an eviction whose KV
    stays on host counts as demoted, and a retained owner demoted is not lost (it comes
    back as a host hit); one freed is."""
    core, client = rpc
    assert "host_demoted_tokens" not in (await client.get("/prism/stats", headers=AUTH)).json()
    r = await client.get("/prism/metrics", headers=AUTH)
    assert "prism:dart_host_demoted_tokens" not in r.text
    core.use_host_tier()
    core.on_assign(None, NodeMeta(AnchorKind.SEGMENT, "A", True), 6)
    core.on_assign(None, NodeMeta(AnchorKind.SEGMENT, "B", True), 5)
    core.inbox.submit_retain(Retention({"A": (2.0, 60.0, None), "B": (1.0, 60.0, None)}))
    core.apply_pending()
    core.on_evicted(NodeMeta(AnchorKind.SEGMENT, "A", True), 6, to_host=True)
    core.on_evicted(NodeMeta(AnchorKind.SEGMENT, "B", True), 5)
    core.on_evicted(None, 3, to_host=True)
    assert core.retained_loss("A").in_cap_at is None
    assert core.retained_loss("B").in_cap_at is not None
    stats = (await client.get("/prism/stats", headers=AUTH)).json()
    assert stats["host_demoted_tokens"] == 9
    assert stats["evicted_tokens"] == {"private": 3, "segment": 0, "protected": 0, "retained": 11}
    r = await client.get("/prism/metrics", headers=AUTH)
    samples = {s.name: s.value for f in text_string_to_metric_families(r.text) for s in f.samples}
    assert samples["prism:dart_host_demoted_tokens_total"] == 9


async def test_a_head_is_ranked_by_its_pushed_entry_and_shown_readably(rpc):
    """The proxy pushes a head's demand under its owner ("\u0000sys:" + its
    id, JSON-escaped on the wire); stats name it `<system:ID>`."""
    core, client = rpc
    core.on_assign(None, NodeMeta(AnchorKind.SYSTEM, "9f2c", True), 8)
    core.on_assign(None, NodeMeta(AnchorKind.SEGMENT, "A", True), 6)
    body = {"epoch": 1, "table": {system_owner("9f2c"): 3.0, "A": 2.0}, "protect": 1}
    assert (await client.post("/prism/priorities", json=body, headers=AUTH)).status_code == 200
    core.apply_pending()
    stats = (await client.get("/prism/stats", headers=AUTH)).json()
    assert stats["protected_segments"] == ["<system:9f2c>"] and stats["protected_tokens"] == 8
    assert stats["protect_fraction"] == 0.25 and stats["protect_cap_tokens"] is None


async def test_refuses_to_start_without_a_token_unless_explicitly_open():
    core = DartCore()
    with pytest.raises(ControlConfigError):
        await start_control_site(core, ControlConfig(port=0))
    runner, port = await start_control_site(core, ControlConfig(port=0, allow_open=True))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            r = await client.post("/prism/priorities", json={"epoch": 1, "table": {"A": 1}})
            assert r.status_code == 200
    finally:
        await runner.cleanup()


def test_config_from_environment_binds_loopback_by_default():
    config = load_config({"PRISM_CONTROL_PORT": "4100", "PRISM_CONTROL_TOKEN": "t"})
    assert config.control == ControlConfig(port=4100, host="127.0.0.1", token="t")
    assert config.policy == "dart" and config.protect == 8 and config.protect_fraction == 0.25
    assert load_config({"PRISM_DART_PROTECT_FRACTION": "0.1"}).protect_fraction == 0.1
    for bad in ("1.5", "-0.1"):
        with pytest.raises(ValueError, match="PROTECT_FRACTION"):
            load_config({"PRISM_DART_PROTECT_FRACTION": bad})
    opened = load_config({"PRISM_CONTROL_OPEN": "1", "PRISM_DART_POLICY": "lru+active"})
    assert opened.control.allow_open and opened.control.port is None
    assert opened.policy == "lru+active"
    with pytest.raises(ValueError):
        load_config({"PRISM_DART_POLICY": "random"})


def test_background_thread_serves_with_its_own_loop():
    core = DartCore()
    with pytest.raises(ControlConfigError):
        ControlThread(core, ControlConfig())
    thread = ControlThread(core, ControlConfig(token=TOKEN))
    port = thread.start(0)
    try:
        url = f"http://127.0.0.1:{port}"
        r = httpx.post(
            url + "/prism/priorities", json={"epoch": 2, "table": {"X": 1}}, headers=AUTH
        )
        assert r.status_code == 200
        r = httpx.post(url + "/prism/priorities", json={"epoch": 2, "table": {}}, headers=AUTH)
        assert r.status_code == 409
        core.apply_pending()
        assert httpx.get(url + "/prism/stats", headers=AUTH).json()["epoch"] == 2
    finally:
        thread.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/prism/health", timeout=2)


def test_launcher_maps_its_options_to_env_and_selects_the_backend():
    from backend_plugin.launch import build_argv

    env: dict[str, str] = {}
    argv = build_argv(
        [
            "--model-path",
            "m",
            "--prism-control-port",
            "4100",
            "--prism-control-token-file=/run/prism/control-token",
            "--prism-policy",
            "lru+active",
            "--prism-protect-fraction=0.1",
            "--tp-size",
            "1",
        ],
        env,
    )
    assert argv == ["--model-path", "m", "--tp-size", "1", "--radix-cache-backend", "prism_dart"]
    assert env == {
        "PRISM_CONTROL_PORT": "4100",
        "PRISM_CONTROL_TOKEN_FILE": "/run/prism/control-token",
        "PRISM_DART_POLICY": "lru+active",
        "PRISM_DART_PROTECT_FRACTION": "0.1",
    }
    kept = build_argv(["--radix-cache-backend=other"], {})
    assert kept == ["--radix-cache-backend=other"]


@pytest.mark.parametrize(
    "flag", ["--prism-control-token", "--api-key", "--admin-api-key=k", "--prism-control-token=t"]
)
def test_launcher_refuses_a_secret_on_the_command_line(flag: str) -> None:
    from backend_plugin.launch import build_argv

    with pytest.raises(SystemExit, match="never given on the command line"):
        build_argv(["--model-path", "m", flag, "t0k"], {})


def test_launcher_appends_sglang_flags_from_the_environment() -> None:
    """PRISM_SGLANG_EXTRA_ARGS (docs/deploy.md) follows the command line, split as a shell
    splits it, under the command line's rules: our options go to the environment, a
    backend given there is kept, a secret is refused, a broken quote stops the launch."""
    from backend_plugin.launch import build_argv

    env = {"PRISM_SGLANG_EXTRA_ARGS": "--enable-hierarchical-cache --hicache-ratio 2 "
           "--prism-policy lru --served-model-name 'my model'"}  # fmt: skip
    argv = build_argv(["--model-path", "m"], env)
    assert argv == [
        "--model-path", "m", "--enable-hierarchical-cache", "--hicache-ratio", "2",
        "--served-model-name", "my model", "--radix-cache-backend", "prism_dart",
    ]  # fmt: skip
    assert env["PRISM_DART_POLICY"] == "lru"
    assert build_argv([], {"PRISM_SGLANG_EXTRA_ARGS": "--radix-cache-backend=lru"}) == [
        "--radix-cache-backend=lru"
    ]
    assert build_argv(["--model-path", "m"], {"PRISM_SGLANG_EXTRA_ARGS": "  "}) == [
        "--model-path", "m", "--radix-cache-backend", "prism_dart"
    ]  # fmt: skip
    with pytest.raises(SystemExit, match="never given on the command line"):
        build_argv([], {"PRISM_SGLANG_EXTRA_ARGS": "--api-key t0k"})
    with pytest.raises(SystemExit, match="PRISM_SGLANG_EXTRA_ARGS: No closing quotation"):
        build_argv([], {"PRISM_SGLANG_EXTRA_ARGS": "--served-model-name 'open"})


def test_launcher_gives_sglang_its_keys_from_the_environment_or_a_file(tmp_path) -> None:
    """SGLang's `--api-key` and `--admin-api-key` reach its argv inside the process (the
    kernel's command line never had them); the file variant strips its newline."""
    from backend_plugin.launch import build_argv

    admin = tmp_path / "admin-key"
    admin.write_text("adm1n\n")
    env = {"PRISM_ENGINE_API_KEY": "k3y", "PRISM_ENGINE_ADMIN_API_KEY_FILE": str(admin)}
    argv = build_argv(["--model-path", "m", "--radix-cache-backend", "lru"], env)
    assert argv == [
        "--model-path", "m", "--radix-cache-backend", "lru",
        "--api-key", "k3y", "--admin-api-key", "adm1n",
    ]  # fmt: skip
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(SystemExit, match="is empty"):
        build_argv([], {"PRISM_ENGINE_API_KEY_FILE": str(tmp_path / "empty")})


def test_plugin_reads_the_control_token_from_a_file(tmp_path) -> None:
    from backend_plugin.config import load_config

    token = tmp_path / "control-token"
    token.write_text("s3cret\n")
    assert load_config({"PRISM_CONTROL_TOKEN_FILE": str(token)}).control.token == "s3cret"
    both = {"PRISM_CONTROL_TOKEN": "env", "PRISM_CONTROL_TOKEN_FILE": str(token)}
    with pytest.raises(ControlConfigError, match=r"given both directly and as .*; give one"):
        load_config(both)  # which one was meant is unknown: the proxy refuses it too
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ControlConfigError, match=r"PRISM_CONTROL_TOKEN_FILE: .* is empty"):
        load_config({"PRISM_CONTROL_TOKEN_FILE": str(tmp_path / "empty")})


def test_sglang_cpu_hands_the_plugin_one_token(tmp_path) -> None:
    """`sglang_cpu.serve` reads the token (from the file here) and gives it to SGLang's
    processes as PRISM_CONTROL_TOKEN alone: the plugin there takes it, not "give one"."""
    from backend_plugin.config import control_token
    from sglang_cpu.serve import sglang_environment

    token_file = tmp_path / "control-token"
    token_file.write_text("s3cret\n")
    base = {"PRISM_CONTROL_TOKEN_FILE": str(token_file)}
    env = sglang_environment(base, control_token=control_token(base))
    assert load_config(env).control.token == "s3cret"
    assert "PRISM_CONTROL_TOKEN_FILE" not in env


def test_inbox_orders_concurrent_submissions():
    """Many RPC threads at once: what the owner drains has strictly increasing epochs,
    every submission is either queued or rejected as stale, and the newest wins."""
    import random
    import threading

    from backend_plugin.dart import PriorityUpdate, StaleEpochError, UpdateInbox

    inbox = UpdateInbox()
    rejected: list[int] = []
    lock = threading.Lock()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(300):
            epoch = rng.randrange(2000)
            try:
                inbox.submit(PriorityUpdate(epoch, {"A": float(epoch)}))
            except StaleEpochError:
                with lock:
                    rejected.append(epoch)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    drained = [u.epoch for u in inbox.drain()]
    assert drained == sorted(set(drained))
    assert len(drained) + len(rejected) == 4 * 300
    assert drained[-1] == inbox.accepted_epoch == max(drained + rejected)
