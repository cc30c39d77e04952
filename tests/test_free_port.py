"""`loadgen.stack.processes.free_port`: the ports our servers are started on."""

from __future__ import annotations

import socket

from loadgen.stack.processes import SERVER_PORTS, free_port


def test_ports_avoid_the_ephemeral_range_and_sglangs_nccl_ports() -> None:
    """Outgoing connections take ports from 32768 up, and every SGLang 0.5.23 server binds
    an NCCL port drawn from 22000-29999 while it starts: a server of ours on either
    loses its port."""
    ports = [free_port() for _ in range(200)]
    assert all(port in SERVER_PORTS for port in ports)
    assert not any(22000 <= port < 30000 or port >= 32768 for port in ports)


def test_a_port_is_not_handed_out_twice_and_is_bindable() -> None:
    """Two servers started one after the other never get the same port, even when the
    first has not bound it yet."""
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", ports[-1]))
