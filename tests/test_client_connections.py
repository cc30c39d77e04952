"""The per-client connection table (`edge.connections`): caps, idleness, which
connection is reclaimed at the proxy's cap, and the table's bound."""

from __future__ import annotations

from prism_proxy.edge.connections import ClientConnections


def test_a_client_is_admitted_up_to_its_cap_and_forgotten_with_its_last_connection() -> None:
    table = ClientConnections[str](max_per_client=2)
    table.opened("a", "a1")
    assert table.admits("a")
    table.opened("a", "a2")
    assert not table.admits("a") and table.admits("b")
    table.closed("a", "a1")
    assert table.admits("a") and len(table) == 1
    table.closed("a", "a2")
    assert len(table) == 0 and table.count("a") == 0


def test_the_oldest_idle_connection_of_the_biggest_holder_is_reclaimed() -> None:
    table = ClientConnections[str](max_per_client=10)
    for conn in ("a1", "a2", "a3"):
        table.opened("a", conn)
    table.opened("b", "b1")
    table.busy("a", "a1")  # a request under way: never reclaimed
    # a holds 3 > what the newcomer c would hold (1): a's oldest idle, a2
    assert table.reclaimable("c") == "a2"
    table.idle("a", "a1")  # idle again: now the most recently idle
    assert table.reclaimable("c") == "a2"
    table.busy("a", "a2")
    table.busy("a", "a3")
    assert table.reclaimable("c") == "a1"
    # b itself would hold 2 with one more: a (3) still holds more
    assert table.reclaimable("b") == "a1"
    # a would hold 4 with one more: nobody holds more than that
    assert table.reclaimable("a") is None


def test_equal_holders_do_not_trade_slots() -> None:
    table = ClientConnections[str](max_per_client=10)
    table.opened("a", "a1")
    table.opened("a", "a2")
    table.opened("b", "b1")
    assert table.reclaimable("b") is None  # b would hold 2, as many as a
    assert table.reclaimable("c") == "a1"


def test_among_many_small_holders_the_big_one_is_found_and_the_table_empties() -> None:
    table = ClientConnections[str](max_per_client=100)
    for i in range(200):  # many addresses holding one connection each
        table.opened(f"10.0.{i // 256}.{i % 256}", f"c{i}")
    assert table.reclaimable("new") is None  # nobody holds more than 1 + 1
    for k in range(5):
        table.opened("big", f"big{k}")
    assert table.reclaimable("new") == "big0"
    for k in range(5):
        table.busy("big", f"big{k}")
    assert table.reclaimable("new") is None  # its requests are under way
    for i in range(200):
        table.closed(f"10.0.{i // 256}.{i % 256}", f"c{i}")
    for k in range(5):
        table.closed("big", f"big{k}")
    assert len(table) == 0 and table.count("big") == 0
