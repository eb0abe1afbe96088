"""broker/node's hand-inlined copies ("twins") agree with their originals."""
from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from quorumqueue.broker.node.node import Node
from quorumqueue.broker.node.vhost import VHost

names = st.sampled_from(["", "q", "orders", "amq.gen-1", "é"])


@settings(max_examples=300, deadline=None)
@given(st.sets(names, max_size=4), names)
def test_the_default_exchange_routes_as_vhost_route_does(declared, routing_key):
    """Node._route's default-exchange case (twin of VHost.route's first case, no
    headers closure built): the same queues as `VHost.route` through the default
    exchange, and a routing cache key, as the general path gives (the default
    exchange never reads headers)."""
    vhost = VHost("/")
    for name in declared:
        vhost.queues[name] = SimpleNamespace(name=name)
    properties = SimpleNamespace(selected_keys=(), decoded=lambda: {"headers": {"h": 1}})
    read = []
    queues, key = Node._route(None, vhost, "", routing_key, properties)
    expected = vhost.route(vhost.exchange(""), routing_key, lambda: read.append(1))
    assert queues == expected and key == ("", routing_key) and not read
