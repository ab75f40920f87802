from __future__ import annotations

import socket

from gateway.ports import free_ports


def test_one_call_hands_out_distinct_ports_that_can_be_bound() -> None:
    ports = free_ports(20)
    assert len(set(ports)) == 20
    socks = []
    try:
        for port in ports:
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", port))
    finally:
        for s in socks:
            s.close()


def test_a_port_another_socket_holds_is_never_handed_out() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        assert taken not in free_ports(200)
