"""When the sandbox may start a stopped server again on its port: a killed etcd or
kube-apiserver leaves its clients' connections in TIME_WAIT on that port for a minute, and
a server started again must not wait for them (the servers listen with ``SO_REUSEADDR``);
a server still listening there must."""

from __future__ import annotations

import socket

from batchsched.sandbox.cluster import free_port, port_free


def _listener(port: int) -> socket.socket:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen()
    return srv


def test_a_port_left_with_connections_in_time_wait_is_free_to_listen_on() -> None:
    port = free_port()
    srv = _listener(port)
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    # the server side closes first, as a killed server's sockets do: its end of the
    # connection stays in TIME_WAIT on the server's port
    conn.close()
    srv.close()
    client.close()
    assert port_free(port)
    # and a server can indeed listen there again
    _listener(port).close()


def test_a_port_with_a_listener_is_not_free() -> None:
    port = free_port()
    srv = _listener(port)
    try:
        assert not port_free(port)
    finally:
        srv.close()
    assert port_free(port)
