"""Users, password hashes, vhost permissions and SASL (PLAIN, AMQPLAIN). Pure.

Password hashes use RabbitMQ's default scheme (rabbit_password_hashing_sha256):
base64(salt || sha256(salt || password)) with a 4-byte random salt, so hashes can
be moved between RabbitMQ definitions and quorumqueue. A user imported from
RabbitMQ's definitions keeps the scheme its hash was made with (RabbitMQ's
`hashing_algorithm`: sha256, sha512 or the pre-3.6 md5, same layout); an empty
hash is a user with no password, who cannot log in with one (as RabbitMQ's).

Permissions are RabbitMQ's: per vhost, three regular expressions (configure, write,
read) matched against resource names (`re.search`, unanchored, as Erlang's re:run;
"" grants nothing, like "^$"). A user with no permissions in a vhost cannot open it.
`check_access` is RabbitMQ's check_resource_access: the default exchange "" is
matched (and named in the refusal) as "amq.default". Which AMQP method needs which
permission on which resource is the handlers' business (node/handlers.py).

`loopback_users` (default: guest) may only log in from a loopback address, as in
RabbitMQ. Invariant: a password is never stored or logged in clear.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import os
import re
from dataclasses import dataclass, field

from ..amqp.errors import resource_refused


SHA256 = "rabbit_password_hashing_sha256"  # RabbitMQ's default since 3.6
# RabbitMQ's hashing module names -> hashlib's name for the digest
HASHING_ALGORITHMS = {SHA256: "sha256", "rabbit_password_hashing_sha512": "sha512",
                      "rabbit_password_hashing_md5": "md5"}


def hash_password(password: str, salt: bytes | None = None, algorithm: str = SHA256) -> str:
    salt = os.urandom(4) if salt is None else salt
    digest = hashlib.new(HASHING_ALGORITHMS[algorithm], salt + password.encode("utf-8"))
    return base64.b64encode(salt + digest.digest()).decode("ascii")


def check_password(password: str, password_hash: str, algorithm: str = SHA256) -> bool:
    if not password_hash or not password:  # no password set; blank ones are refused
        return False
    raw = base64.b64decode(password_hash)
    salt, digest = raw[:4], raw[4:]
    computed = hashlib.new(HASHING_ALGORITHMS[algorithm], salt + password.encode("utf-8"))
    return hmac.compare_digest(computed.digest(), digest)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host == "localhost"


PERMISSION_KINDS = ("configure", "write", "read")


class InvalidPattern(ValueError):
    """A permission pattern that is not a regular expression."""


@dataclass(frozen=True, slots=True)
class Permissions:
    """A user's rights in one vhost: a regular expression per kind of access."""
    configure: str = ".*"
    write: str = ".*"
    read: str = ".*"

    def __post_init__(self) -> None:
        for kind in PERMISSION_KINDS:
            try:
                re.compile(getattr(self, kind))
            except re.error as error:
                raise InvalidPattern(f"{kind} pattern {getattr(self, kind)!r} is not a "
                                     f"regular expression: {error}") from None

    def allows(self, kind: str, name: str) -> bool:
        """May `kind` access (configure, write or read) happen to resource `name`?"""
        pattern = getattr(self, kind)
        return bool(pattern) and re.search(pattern, name) is not None

    def as_list(self) -> list[str]:
        return [self.configure, self.write, self.read]


FULL = Permissions()


@dataclass(slots=True)
class User:
    name: str
    password_hash: str
    tags: tuple[str, ...] = ()
    permissions: dict[str, Permissions] = field(default_factory=dict)  # vhost -> rights
    # rabbitmqctl set_user_limits: "max-connections", "max-channels" -> a count (a
    # negative one is no limit); enforced by the node (broker/node/limits.py)
    limits: dict[str, int] = field(default_factory=dict)
    hashing: str = SHA256  # how password_hash was made: a key of HASHING_ALGORITHMS

    @property
    def vhosts(self) -> set[str]:
        """The vhosts this user may open (has permissions in)."""
        return set(self.permissions)

    @property
    def is_administrator(self) -> bool:
        return "administrator" in self.tags

    def may(self, vhost: str, kind: str, name: str) -> bool:
        permissions = self.permissions.get(vhost)
        return permissions is not None and permissions.allows(kind, name)


DEFAULT_EXCHANGE_RESOURCE = "amq.default"  # what RabbitMQ checks for the exchange ""


def check_access(user: User, vhost: str, permission: str, kind: str, name: str) -> None:
    """Raise 403 ACCESS_REFUSED unless `user` may `permission` (configure, write or
    read) the `kind` ("queue" or "exchange") called `name` in `vhost`."""
    if kind == "exchange" and name == "":
        name = DEFAULT_EXCHANGE_RESOURCE
    if not user.may(vhost, permission, name):
        raise resource_refused(kind, name, vhost, user.name)


@dataclass(slots=True)
class UserStore:
    users: dict[str, User] = field(default_factory=dict)
    loopback_users: frozenset[str] = frozenset({"guest"})

    @classmethod
    def with_default_user(cls, loopback_users: frozenset[str] = frozenset({"guest"})
                          ) -> "UserStore":
        store = cls(loopback_users=loopback_users)
        store.add("guest", "guest", tags=("administrator",), vhosts={"/"})
        return store

    def add(self, name: str, password: str, tags=(), vhosts=("/",)) -> User:
        """A user with full permissions in `vhosts` (the configured default user)."""
        user = User(name, hash_password(password), tuple(tags),
                    {vhost: FULL for vhost in vhosts})
        self.users[name] = user
        return user

    def authenticate(self, username: str, password: str, peer_host: str) -> User | None:
        return self.login(username, password, peer_host)[0]

    def login(self, username: str, password: str, peer_host: str) -> tuple[User | None, str]:
        """(the user, "") or (None, why, as RabbitMQ's log says it)."""
        user = self.users.get(username)
        if user is None or not check_password(password, user.password_hash, user.hashing):
            return None, f"user '{username}' - invalid credentials"
        if username in self.loopback_users and not is_loopback(peer_host):
            return None, f"user '{username}' can only connect via localhost"
        return user, ""


class SaslError(ValueError):
    pass


def parse_sasl_response(mechanism: str, response: bytes) -> tuple[str, str]:
    """(username, password) from a start-ok response. PLAIN (RFC 4616) is
    `authzid NUL authcid NUL password`: an authorization identity other than the user
    logging in (`alice NUL guest NUL guest`: log in as guest, act as alice) is
    refused, as RabbitMQ refuses it; one equal to the user is the user (RFC 4616's
    derived identity; RabbitMQ 3.10.8 refuses any non-empty one)."""
    if mechanism == "PLAIN":
        parts = response.split(b"\x00")
        if len(parts) != 3:
            raise SaslError(f"PLAIN response has {len(parts)} NUL-separated parts, not 3 "
                            "(authorization identity, user, password)")
        authzid, username, password = parts
        if authzid and authzid != username:
            raise SaslError(f"PLAIN authorization identity "
                            f"'{authzid.decode('utf-8', 'replace')}' is not the user "
                            f"'{username.decode('utf-8', 'replace')}'")
        return username.decode("utf-8", "replace"), password.decode("utf-8", "replace")
    if mechanism == "AMQPLAIN":
        from ..amqp.codec import decode_field_table

        try:
            table = decode_field_table(response)
        except Exception as error:  # AMQPError from the codec
            raise SaslError(f"malformed AMQPLAIN response: {error}") from None
        login, password = table.get("LOGIN"), table.get("PASSWORD")
        if login is None or password is None:
            raise SaslError("AMQPLAIN response lacks LOGIN or PASSWORD")
        as_text = lambda v: v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
        return as_text(login), as_text(password)
    raise SaslError(f"unsupported mechanism {mechanism}")


def amqplain_response(username: str, password: str) -> bytes:
    """Client side of AMQPLAIN, for tests."""
    from ..amqp.codec import field_table

    table = field_table({"LOGIN": username, "PASSWORD": password})
    return table[4:]  # AMQPLAIN sends the table without its length prefix


__all__ = ["User", "UserStore", "Permissions", "FULL", "PERMISSION_KINDS", "InvalidPattern",
           "check_access", "DEFAULT_EXCHANGE_RESOURCE",
           "hash_password", "check_password", "parse_sasl_response",
           "amqplain_response", "SaslError", "is_loopback"]
