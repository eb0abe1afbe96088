"""access.py's rules as RabbitMQ's management plugin applies them (rabbit_mgmt_util):
credentials, guest only from loopback, management tags and their levels."""

from __future__ import annotations

import base64
from types import SimpleNamespace

import pytest

from quorumqueue.broker.auth.users import UserStore
from quorumqueue.broker.management.access import (Refused, authenticate, has, require,
                                                  visible_vhosts)


def node_with(*users: tuple[str, tuple[str, ...]]):
    store = UserStore.with_default_user()
    for name, tags in users:
        store.add(name, name, tags, {"/"})
    return SimpleNamespace(users=store, vhosts={"/": None, "other": None},
                           authenticate=store.authenticate)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize("header", [None, "Bearer x", "Basic !!!", basic("guest", "nope"),
                                    basic("nobody", "x")])
def test_bad_credentials_are_login_failed(header):
    with pytest.raises(Refused) as refused:
        authenticate(node_with(), header, "127.0.0.1")
    assert (refused.value.status, refused.value.error, refused.value.reason) == (
        401, "not_authorized", "Login failed")


def test_guest_only_from_loopback():
    user, _password = authenticate(node_with(), basic("guest", "guest"), "::1")
    assert user.name == "guest"
    with pytest.raises(Refused) as refused:
        authenticate(node_with(), basic("guest", "guest"), "10.1.2.3")
    assert refused.value.reason == "User can only log in via localhost"


def test_a_user_without_a_management_tag_is_refused():
    with pytest.raises(Refused) as refused:
        authenticate(node_with(("app", ())), basic("app", "app"), "127.0.0.1")
    assert (refused.value.error, refused.value.reason) == ("not_authorised",
                                                           "Not management user")


@pytest.mark.parametrize("tags, levels", [
    (("management",), {"management"}),
    (("policymaker",), {"management", "policymaker"}),
    (("monitoring",), {"management", "monitoring"}),
    (("administrator",), {"management", "policymaker", "monitoring", "administrator"}),
])
def test_tag_levels(tags, levels):
    user = SimpleNamespace(tags=tags)
    assert {level for level in ("management", "policymaker", "monitoring", "administrator")
            if has(user, level)} == levels
    if "administrator" not in levels:
        with pytest.raises(Refused, match="Not administrator user"):
            require(user, "administrator")


def test_monitoring_sees_every_vhost_management_only_its_own():
    node = node_with()
    monitor = SimpleNamespace(tags=("monitoring",), permissions={"/": None})
    manager = SimpleNamespace(tags=("management",), permissions={"/": None})
    assert visible_vhosts(node, monitor) == ["/", "other"]
    assert visible_vhosts(node, manager) == ["/"]
