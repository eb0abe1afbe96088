"""Field values as RabbitMQ's Erlang terms (broker/node/field_terms.py): how its texts
print them and which redeclared arguments it takes for the same. The texts are
checked against RabbitMQ 3.10.8 itself in tests/differential/test_against_rabbitmq.py
(queue_redeclared_with_another_field_type, headers_binding_x_match_validated)."""

from __future__ import annotations

import decimal

import pytest

from quorumqueue.broker.field_values import Timestamp
from quorumqueue.broker.node.field_terms import erlang_float, erlang_term, same_argument, shown


@pytest.mark.parametrize("value, printed", [
    (1000.0, "1.0e3"), (100.0, "100.0"), (10.0, "10.0"), (1200000.0, "1.2e6"),
    (12.5, "12.5"), (1234.0, "1234.0"), (0.001, "0.001"), (1e-05, "1.0e-5"),
    (-1000.0, "-1.0e3"), (0.0, "0.0"),
])
def test_floats_print_as_erlang_prints_them(value, printed):
    """io_lib_format:fwrite_g: the shortest digits, fixed unless scientific is shorter."""
    assert erlang_float(value) == printed


@pytest.mark.parametrize("value, printed", [
    ("ALL", '<<"ALL">>'), ("", "<<>>"), (bytearray(b"all"), '<<"all">>'),
    ("é", "<<195,169>>"), (True, "true"), (7, "7"), (Timestamp(5), "5"),
    (["all"], '[{longstr,<<"all">>}]'), ({}, "[]"), ({"k": 1}, '[{<<"k">>,signedint,1}]'),
    (None, "undefined"), (decimal.Decimal("3.14"), "{2,314}"),
])
def test_terms_print_as_erlang_prints_them(value, printed):
    assert erlang_term(value) == printed


def test_inequivalence_texts_show_binaries_as_text():
    assert shown(bytearray(b"1000")) == "1000" and shown("1000") == "1000"
    assert shown(1000.0) == "1.0e3" and shown([1000]) == "[{signedint,1000}]"


@pytest.mark.parametrize("a, b, same", [
    (1000, 1000, True), (1000, Timestamp(1000), True),    # both the integer 1000
    (1000, 1000.0, False), (1000, "1000", False), (1000, True, False), (1, True, False),
    ("x", b"x", True), ("x", bytearray(b"x"), True),       # binaries alike
    (1000, decimal.Decimal(1000), False), ({}, [], False), ([1], [1], True),
    ([1], [1.0], False),
])
def test_arguments_are_the_same_when_their_terms_are(a, b, same):
    """rabbit_misc:assert_args_equivalence: equal type classes and values, else
    identical values."""
    assert same_argument(a, b) is same
