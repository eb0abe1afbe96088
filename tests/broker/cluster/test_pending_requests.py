"""The index of forwarded requests waiting for a leader (cluster.py `_PendingRequests`):
a leader change visits only its group's requests, a tick only the overdue ones."""

from __future__ import annotations

from quorumqueue.broker.cluster.cluster import _Pending, _PendingRequests


class _Member:  # what _Pending needs of a group member: its identity
    pass


def test_a_groups_requests_are_found_without_the_others() -> None:
    pendings = _PendingRequests()
    a, b = _Member(), _Member()
    for request in range(1000):
        pendings.add(request, _Pending(b, b"x", None))
    pendings.add(5000, _Pending(a, b"y", None))
    pendings.add(5001, _Pending(a, b"z", None))
    assert pendings.of_member(a) == [5000, 5001]
    assert len(pendings.of_member(b)) == 1000
    assert pendings.pop(5000).data == b"y"
    del pendings[5001]
    assert pendings.of_member(a) == []
    assert pendings.pop(5001) is None and 5001 not in pendings
    assert len(pendings) == 1000


def test_overdue_requests_come_in_the_order_last_sent() -> None:
    pendings = _PendingRequests()
    member = _Member()
    items = {request: _Pending(member, b"", None) for request in (1, 2, 3)}
    for request, pending in items.items():
        pendings.add(request, pending)
        pendings.sent(request, pending, float(request))   # sent at 1.0, 2.0, 3.0
    assert pendings.overdue(2.5) == [1, 2]
    pendings.sent(1, items[1], 10.0)                      # sent again: now the newest
    assert pendings.overdue(2.5) == [2]
    assert pendings.overdue(11.0) == [2, 3, 1]
    assert [p for p in pendings.values()] == [items[2], items[3], items[1]]
