"""Who may call what: HTTP basic auth against the broker's users, with RabbitMQ's
management user tags and vhost permissions.

Responsibilities: `authenticate` (the Authorization header, the user store, guest
only from loopback), `require` (a tag level), and which vhosts a user sees.
RabbitMQ's rules (rabbit_mgmt_util), checked against 3.10.8:
- a user needs one of the tags `management`, `policymaker`, `monitoring`,
  `administrator` to use the API at all ("Not management user");
- `policymaker` adds policies of the user's vhosts; `monitoring` adds every
  connection and channel, /api/nodes and every vhost in /api/vhosts;
  `administrator` everything (users, permissions, vhosts, definitions);
- queues, exchanges, bindings and consumers are listed for the vhosts the user has
  permissions in, whatever the tags; changes to them go through an AMQP connection
  as that user (direct.py), so the vhost permissions decide.
Refusals are 401 with RabbitMQ's bodies: `{"error":"not_authorized","reason":"Login
failed"}` for credentials, `{"error":"not_authorised","reason":"Not administrator
user"}` for a tag.

Not here: HTTP routing (views.py), the user store (broker/auth/).
"""

from __future__ import annotations

import base64
import binascii
import logging

from ..auth.users import is_loopback

log = logging.getLogger("quorumqueue.broker")

MANAGEMENT_TAGS = frozenset({"management", "policymaker", "monitoring", "administrator"})
# the tags that satisfy each level (RabbitMQ: a higher tag implies the lower ones)
LEVELS = {
    "management": MANAGEMENT_TAGS,
    "policymaker": frozenset({"policymaker", "administrator"}),
    "monitoring": frozenset({"monitoring", "administrator"}),
    "administrator": frozenset({"administrator"}),
}
LEVEL_REFUSALS = {"management": "Not management user",
                  "policymaker": "Not policymaker user",
                  "monitoring": "Not monitor user",
                  "administrator": "Not administrator user"}


class Refused(Exception):
    """401 with RabbitMQ's JSON body."""

    def __init__(self, error: str, reason: str, status: int = 401,
                 amqp_text: str | None = None) -> None:
        super().__init__(reason)
        self.error = error
        self.reason = reason
        self.status = status
        # the AMQP reply text (`NAME - detail`) the refusal came from, if any: sent
        # in the X-Quorumqueue-Error header for the command line (app.py)
        self.amqp_text = amqp_text


def credentials(header: str | None) -> tuple[str, str]:
    if not header or not header.lower().startswith("basic "):
        raise Refused("not_authorized", "Login failed")
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise Refused("not_authorized", "Login failed") from None
    username, separator, password = decoded.partition(":")
    if not separator:
        raise Refused("not_authorized", "Login failed")
    return username, password


def authenticate(node, header: str | None, peer_host: str):
    """The user the request speaks for (RabbitMQ: no management tag, no entry). A
    refusal of credentials is logged as rabbit_mgmt_util logs it ("HTTP access
    denied: user 'NAME' - invalid credentials"), with the peer's address."""
    username, password = credentials(header)
    user = node.users.users.get(username)
    if user is not None and username in node.users.loopback_users \
            and not is_loopback(peer_host):
        _denied(username, "User can only log in via localhost", peer_host)
        raise Refused("not_authorised", "User can only log in via localhost")
    user = node.authenticate(username, password, peer_host)
    if user is None:
        _denied(username, "invalid credentials", peer_host)
        raise Refused("not_authorized", "Login failed")
    if not MANAGEMENT_TAGS & set(user.tags):
        _denied(username, "Not management user", peer_host)
        raise Refused("not_authorised", "Not management user")
    return user, password


def _denied(username: str, why: str, peer_host: str) -> None:
    log.warning("HTTP access denied: user '%s' - %s (from %s)", username, why, peer_host)


def has(user, level: str) -> bool:
    return bool(LEVELS[level] & set(user.tags))


def require(user, level: str) -> None:
    if not has(user, level):
        raise Refused("not_authorised", LEVEL_REFUSALS[level])


def login_vhosts(node, user) -> list[str]:
    """The vhosts whose queues, exchanges and bindings the user sees."""
    return sorted(name for name in node.vhosts if name in user.permissions)


def visible_vhosts(node, user) -> list[str]:
    """The vhosts /api/vhosts shows: all to monitoring and administrators."""
    if has(user, "monitoring"):
        return sorted(node.vhosts)
    return login_vhosts(node, user)


def require_vhost(node, user, vhost: str) -> None:
    """A vhost named in a URL: it must exist (404) and the user must be able to log
    in to it (401 "User not authorised to access virtual host")."""
    if vhost not in node.vhosts:
        raise Refused("Object Not Found", "Not Found", 404)
    if vhost not in user.permissions and not has(user, "administrator"):
        raise Refused("not_authorised", "User not authorised to access virtual host")
