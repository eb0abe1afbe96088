"""The TCP proxy the fault tests put between nodes (tests/support/cluster.py), in front
of a small echo server: it forwards both ways; a "drop" cut resets connections and
refuses new ones; a "stall" cut holds bytes, one direction or both; heal restores the
flow (and delivers what a stall held); stop leaves no thread and no listener.
"""

from __future__ import annotations

import socket
import socketserver
import threading

import pytest

from tests.support.cluster import TcpProxy

pytestmark = pytest.mark.timeout(30)

QUIET = 0.3  # how long a test listens to be sure nothing arrives


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            while data := self.request.recv(65536):
                self.server.received.append(data)
                self.request.sendall(data)
        except ConnectionResetError:  # the proxy resets links it drops
            pass


@pytest.fixture
def echo():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    server.received = []
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture
def proxy(echo):
    with TcpProxy(echo.server_address[1], name="test") as running:
        yield running
    assert not [t for t in threading.enumerate() if t.name.startswith("tcp-proxy")]


def connect(proxy: TcpProxy) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    client.settimeout(5)
    return client


def roundtrip(client: socket.socket, data: bytes) -> bytes:
    client.sendall(data)
    received = b""
    while len(received) < len(data):
        chunk = client.recv(65536)
        if not chunk:
            break
        received += chunk
    return received


def nothing_arrives(client: socket.socket) -> bool:
    client.settimeout(QUIET)
    try:
        return client.recv(65536) == b"" and False
    except TimeoutError:
        return True
    finally:
        client.settimeout(5)


def is_reset(client: socket.socket) -> bool:
    """The connection was closed under the client (RST, or EOF)."""
    try:
        client.sendall(b"x")
        return client.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def new_connection_fails(proxy: TcpProxy) -> bool:
    """Reset during connect (the proxy accepted and reset at once) or right after."""
    try:
        client = connect(proxy)
    except ConnectionResetError:
        return True
    with client:
        return is_reset(client)


def test_forwards_both_ways_and_counts_bytes(proxy, echo):
    with connect(proxy) as client:
        assert roundtrip(client, b"ping") == b"ping"
        assert roundtrip(client, b"x" * 200_000) == b"x" * 200_000
    assert b"".join(echo.received) == b"ping" + b"x" * 200_000
    assert proxy.bytes_forwarded == {"forward": 200_004, "backward": 200_004}
    assert proxy.state == "open"


def test_drop_cut_resets_open_and_new_connections_until_healed(proxy):
    with connect(proxy) as before:
        assert roundtrip(before, b"a") == b"a"
        proxy.cut()
        assert proxy.state == "dropping" and proxy.connections == 0
        assert is_reset(before)
    assert new_connection_fails(proxy)  # accepted, then reset at once
    proxy.heal()
    with connect(proxy) as after:
        assert roundtrip(after, b"b") == b"b"


def test_stall_holds_bytes_and_heal_delivers_them(proxy, echo):
    with connect(proxy) as client:
        assert roundtrip(client, b"a") == b"a"
        proxy.cut("stall")
        assert proxy.state == "stalled forward+backward"
        client.sendall(b"held")
        assert nothing_arrives(client)
        assert b"held" not in b"".join(echo.received)
        proxy.heal()
        assert client.recv(4) == b"held"


def test_a_new_connection_during_a_stall_reaches_the_target_on_heal(proxy, echo):
    proxy.cut("stall")
    with connect(proxy) as client:
        client.sendall(b"early")
        assert nothing_arrives(client)
        proxy.heal()
        assert client.recv(5) == b"early"


def test_one_way_stall_lets_the_other_direction_through(proxy, echo):
    with connect(proxy) as client:
        assert roundtrip(client, b"a") == b"a"
        proxy.cut("stall", "backward")  # the target hears us; we do not hear it
        assert proxy.state == "stalled backward"
        client.sendall(b"one-way")
        assert nothing_arrives(client)
        assert b"".join(echo.received) == b"a" + b"one-way"
        proxy.heal()
        assert client.recv(7) == b"one-way"


def test_cuts_are_refused_when_they_make_no_sense(proxy):
    with pytest.raises(ValueError, match="always both ways"):
        proxy.cut("drop", "forward")
    with pytest.raises(ValueError, match="mode"):
        proxy.cut("lose")
    with pytest.raises(ValueError, match="direction"):
        proxy.cut("stall", "sideways")


def test_a_target_that_is_down_resets_the_client(echo):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    with TcpProxy(closed_port) as proxy:
        assert new_connection_fails(proxy)


def test_stop_closes_connections_listener_and_thread(echo):
    proxy = TcpProxy(echo.server_address[1]).start()
    client = connect(proxy)
    assert roundtrip(client, b"a") == b"a"
    proxy.stop()
    proxy.stop()  # idempotent
    assert is_reset(client)
    client.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
    assert not [t for t in threading.enumerate() if t.name.startswith("tcp-proxy")]
    with pytest.raises(RuntimeError, match="not running"):
        proxy.heal()


def test_a_slow_link_delays_every_chunk_each_way_until_healed(proxy, echo):
    import time

    client = connect(proxy)
    proxy.slow(0.3)
    started = time.monotonic()
    assert roundtrip(client, b"slow") == b"slow"
    assert time.monotonic() - started >= 0.6  # 0.3 s there and 0.3 s back, at least
    proxy.heal()
    assert proxy.delay == 0
    assert roundtrip(client, b"fast") == b"fast"
    with pytest.raises(ValueError, match="delay"):
        proxy.slow(-1)
