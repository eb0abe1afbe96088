"""Logging in over AMQP: PLAIN's authorization identity and what a refusal logs
(issue 30). RFC 4616's PLAIN response is `authzid NUL user NUL password`; a client
that names another identity (`alice NUL guest NUL guest`: guest's password, acting
as alice) logged in as guest before. Now it is refused as RabbitMQ 3.10.8 refuses it,
a syntax error: no connection.close (not even for clients that ask for one), the
socket kept open, unread, for three seconds (tests/differential/
test_handshake_against_rabbitmq.py compares it). An identity equal to the user is the
user (RFC 4616; RabbitMQ 3.10.8 refuses it too: a deliberate difference). Refused
logins are logged on one line with the user and the peer, in rabbit_reader's words."""

from __future__ import annotations

import logging

import pytest

from quorumqueue.broker.amqp import spec
from quorumqueue.broker.amqp.connection import SILENT_CLOSE_DELAY, ConnectionState
from tests.broker.node.harness import Client, new_node


def started(**client) -> Client:
    client = Client(new_node(), **client)
    client.send_bytes(spec.PROTOCOL_HEADER)
    client.expect_one("Connection.Start")
    return client


@pytest.mark.parametrize("response", ["alice\0guest\0guest", "nobody\0guest\0guest"])
def test_another_authorization_identity_is_refused_silently(response, caplog):
    caplog.set_level(logging.ERROR, logger="quorumqueue.broker")
    client = started()
    client.start_ok(response=response)   # the client asks for authentication_failure_close
    assert client.read() == []
    assert client.session.closed and client.session.user is None
    assert client.session.connection.linger == SILENT_CLOSE_DELAY
    authzid = response.split("\0")[0]
    assert (f"PLAIN response invalid: PLAIN authorization identity '{authzid}' is not the "
            "user 'guest'") in caplog.text


@pytest.mark.parametrize("response", ["guest\0guest", "\0guest\0guest\0extra", "guest"])
def test_a_plain_response_without_three_parts_is_refused_silently(response):
    client = started()
    client.start_ok(response=response)
    assert client.read() == []
    assert client.session.closed
    assert client.session.connection.linger == SILENT_CLOSE_DELAY


def test_the_users_own_authorization_identity_is_the_user():
    client = started()
    client.start_ok(response="guest\0guest\0guest")
    client.expect_one("Connection.Tune")
    assert client.session.user.name == "guest"
    assert client.session.state is ConnectionState.AWAITING_TUNE_OK


def test_a_refused_login_is_logged_with_the_user_and_the_peer(caplog):
    caplog.set_level(logging.ERROR, logger="quorumqueue.broker")
    client = started(peer_host="127.0.0.1")
    client.start_ok(password="wrong")
    assert client.expect_one("Connection.Close").reply_code == 403
    assert ("Error on AMQP connection 127.0.0.1 (state: starting): PLAIN login refused: "
            "user 'guest' - invalid credentials") in caplog.text
    caplog.clear()
    client = started(peer_host="10.0.0.5")
    client.start_ok()
    assert client.expect_one("Connection.Close").reply_code == 403
    assert ("Error on AMQP connection 10.0.0.5 (state: starting): PLAIN login refused: "
            "user 'guest' can only connect via localhost") in caplog.text
