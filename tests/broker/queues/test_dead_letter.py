"""The dead-lettered copy of a message (broker/queues/dead_letter.py), against the dead
letter exchanges guide ("Dead-Lettered Messages") and RabbitMQ 4.x's headers: the
x-death table per (queue, reason), x-first-death-* once, x-last-death-* each time,
expiration and BCC removed, and the cycle rule. The same headers are compared with
RabbitMQ 3.10.8 live in tests/differential/test_dead_letter_against_rabbitmq.py."""

from __future__ import annotations

from quorumqueue.broker.amqp import codec
from quorumqueue.broker.field_values import Timestamp
from quorumqueue.broker.queues.dead_letter import (copy_properties, dead_lettered, is_cycle,
                                                    routing_keys)


def _header(**values) -> bytes:
    return codec.encode_properties(3, values)


def _props(header: bytes) -> dict:
    return codec.decode_properties(header)[1].decoded()


def test_first_death_writes_x_death_first_and_last_and_drops_expiration_and_bcc():
    header = _header(expiration="5000", delivery_mode=2,
                     headers={"CC": ["cc-key"], "BCC": ["secret"], "app": "kept"})
    copy, deaths = dead_lettered(header, "orders", "rk", "work", "rejected", 1_700_000_000_500)
    props = _props(copy)
    headers = props["headers"]
    assert props["expiration"] is None and props["delivery_mode"] == 2
    assert "BCC" not in headers and headers["CC"] == ["cc-key"] and headers["app"] == "kept"
    assert [(d["queue"], d["reason"]) for d in deaths] == [("work", "rejected")]
    assert headers["x-death"] == [{
        "count": 1, "reason": "rejected", "queue": "work",
        "time": Timestamp(1_700_000_000),  # 2023-11-14 22:13:20 UTC, whole seconds
        "exchange": "orders", "routing-keys": ["rk", "cc-key"],
        "original-expiration": "5000"}]
    assert [headers[f"x-first-death-{k}"] for k in ("reason", "queue", "exchange")] == \
        ["rejected", "work", "orders"]
    assert [headers[f"x-last-death-{k}"] for k in ("reason", "queue", "exchange")] == \
        ["rejected", "work", "orders"]


def test_dying_again_counts_per_queue_and_reason_and_moves_the_table_first():
    copy, _ = dead_lettered(_header(), "", "work", "work", "rejected", 1_000)
    copy, _ = dead_lettered(copy, "", "delay", "delay", "expired", 2_000)
    copy, deaths = dead_lettered(copy, "", "work", "work", "rejected", 3_000)
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [
        ("work", "rejected", 2), ("delay", "expired", 1)]
    headers = _props(copy)["headers"]
    assert headers["x-first-death-queue"] == "work" and headers["x-last-death-queue"] == "work"
    assert headers["x-last-death-reason"] == "rejected"
    # the table keeps its first death's time (RabbitMQ 3.10 and 4.x)
    assert deaths[0]["time"] == Timestamp(1) and isinstance(deaths[0]["time"], Timestamp)


def test_routing_keys_are_the_dead_letter_key_or_the_message_keys_with_cc():
    header = _header(headers={"CC": ["b"]})
    assert routing_keys("a", header, None) == ["a", "b"]
    assert routing_keys("a", header, "dl") == ["dl"]


def test_the_message_bcc_keys_route_its_copy_unless_a_dead_letter_key_replaces_them():
    """rabbit_dead_letter routes the copy by the message's routing keys (routing key,
    CC, BCC: the BCC header itself was removed at publish), and a dead-letter routing
    key replaces them all; x-death's routing-keys still list the routing key and CC."""
    header = _header(headers={"CC": ["b"]})
    assert routing_keys("a", header, None, ("c", "d")) == ["a", "b", "c", "d"]
    assert routing_keys("a", header, "dl", ("c", "d")) == ["dl"]
    copy, deaths = dead_lettered(header, "ex", "a", "work", "rejected", 1_000)
    assert deaths[0]["routing-keys"] == ["a", "b"]
    assert copy_properties(copy, None, ("c", "d")).blind_keys == ("c", "d")
    assert copy_properties(copy, "dl", ("c", "d")).blind_keys == ()
    assert copy_properties(copy, None, ("c",)).raw == copy  # beside the header, not in it


def test_cycle_only_when_every_death_back_to_the_target_was_automatic():
    expired_loop = [{"queue": "q", "reason": "expired"}]
    assert is_cycle("q", "expired", expired_loop)               # TTL back to itself
    assert not is_cycle("other", "expired", expired_loop)
    retry = [{"queue": "delay", "reason": "expired"}, {"queue": "work", "reason": "rejected"}]
    assert not is_cycle("work", "expired", retry)               # a client rejected on the way
    automatic = [{"queue": "b", "reason": "maxlen"}, {"queue": "a", "reason": "expired"}]
    assert is_cycle("a", "maxlen", automatic)
    assert not is_cycle("a", "rejected", automatic)             # a rejection never cycles
