from __future__ import annotations

import socket
from pathlib import Path

from gateway.ports import LINUX_EPHEMERAL, ephemeral_range, free_ports


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


def test_ports_are_drawn_below_the_range_outgoing_connections_take_theirs_from() -> None:
    """An outgoing connection's local port comes from the ephemeral range; a port found
    free there can be taken so before its server binds it (seen in CI: a gateway that
    exited at start-up while the other benchmarks ran)."""
    low, _ = ephemeral_range()
    assert all(p < low for p in free_ports(50))
    with socket.create_server(("127.0.0.1", 0)) as server:
        outgoing = socket.create_connection(server.getsockname())
        with outgoing:
            assert outgoing.getsockname()[1] >= low


def test_a_port_another_socket_holds_is_never_handed_out() -> None:
    """Hostile twin: every port of a narrow pool but one is held by someone else."""
    held = []
    try:
        for port in range(10000, 11010):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            held.append(s)
        free = held.pop()
        free_port = free.getsockname()[1]
        free.close()
        assert free_ports(1, ephemeral=(11010, 60999)) == [free_port]
    finally:
        for s in held:
            s.close()


def test_where_the_range_leaves_no_room_below_it_the_kernel_picks() -> None:
    ports = free_ports(3, ephemeral=(1024, 65535))
    assert len(set(ports)) == 3


def test_an_unreadable_range_is_the_kernels_default(tmp_path: Path) -> None:
    assert ephemeral_range(tmp_path / "absent") == LINUX_EPHEMERAL
    (tmp_path / "range").write_text("40000\t50000\n")
    assert ephemeral_range(tmp_path / "range") == (40000, 50000)
