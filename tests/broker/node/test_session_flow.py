"""Flow control at the session (node/session.py `take_input`): the server shell gives
each group-commit round a budget of client input (`flow_control.round_methods`,
docs/behaviour/flow-control.md); input past it waits in the session, in order, until
the shell hands it a new budget. RabbitMQ's flow control guide: a connection in flow
"should not see any difference from normal running" but a slower rate, so nothing
received may be lost, reordered or acted on twice.

Pure: the harness feeds bytes to a Session, no sockets."""

from __future__ import annotations

from pamqp import commands

from tests.broker.node.harness import Client, marshal, method, new_node


def opened() -> Client:
    client = Client(new_node())
    client.handshake()
    client.open_channel(1)
    client.declare_queue(1, "q")
    client.read()
    return client


def publishes(count: int, client: Client) -> bytes:
    from tests.broker.node.harness import content_frames

    return b"".join(marshal(method(commands.Basic.Publish, exchange="", routing_key="q"), 1)
                    + content_frames(1, str(index).encode(), None, client.frame_max)
                    for index in range(count))


def stored(client: Client) -> int:
    return client.node.vhosts["/"].queues["q"].ready_count


def bodies(client: Client, count: int) -> list[bytes]:
    return [client.get(1, "q").body for _ in range(count)]


def test_input_past_the_budget_waits_and_is_handled_in_order_by_the_next_budgets():
    client = opened()
    session = client.session
    assert session.receive_data(publishes(10, client), client.now, budget=3) == 3
    assert session.input_held and stored(client) == 3
    # other paths (the shell's ticks) leave held input alone: order stays the shell's
    session.tick(client.now)
    assert session.input_held and stored(client) == 3
    assert session.take_input(4) == 4
    assert session.input_held and stored(client) == 7
    assert session.take_input(100) == 3           # the rest, with budget to spare
    assert not session.input_held and stored(client) == 10
    assert bodies(client, 10) == [str(index).encode() for index in range(10)]


def test_a_budget_of_nothing_takes_the_bytes_and_handles_none():
    client = opened()
    session = client.session
    assert session.receive_data(publishes(2, client), client.now, budget=0) == 0
    assert session.input_held and stored(client) == 0
    assert session.take_input() == 2
    assert not session.input_held and stored(client) == 2


def test_held_input_is_acted_on_when_the_socket_goes():
    """The shell reads nothing more from a held client, but what it had received
    before the socket closed is handled as it would have been without flow control."""
    client = opened()
    session = client.session
    session.receive_data(publishes(5, client), client.now, budget=1)
    assert session.input_held
    session.connection_lost()
    assert not session.input_held and session.closed
    assert stored(client) == 5
