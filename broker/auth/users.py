"""Users, password hashes, vhost permissions and SASL (PLAIN, AMQPLAIN). Pure.

Password hashes use RabbitMQ's default scheme (rabbit_password_hashing_sha256):
base64(salt || sha256(salt || password)) with a 4-byte random salt, so hashes can
be moved between RabbitMQ definitions and quorumqueue.

`loopback_users` (default: guest) may only log in from a loopback address, as in
RabbitMQ. Invariant: a password is never stored or logged in clear.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import os
from dataclasses import dataclass, field


def hash_password(password: str, salt: bytes | None = None) -> str:
    salt = os.urandom(4) if salt is None else salt
    digest = hashlib.sha256(salt + password.encode("utf-8")).digest()
    return base64.b64encode(salt + digest).decode("ascii")


def check_password(password: str, password_hash: str) -> bool:
    raw = base64.b64decode(password_hash)
    salt, digest = raw[:4], raw[4:]
    return hmac.compare_digest(hashlib.sha256(salt + password.encode("utf-8")).digest(), digest)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host == "localhost"


@dataclass(slots=True)
class User:
    name: str
    password_hash: str
    tags: tuple[str, ...] = ()
    vhosts: set[str] = field(default_factory=set)  # vhosts this user may open


@dataclass(slots=True)
class UserStore:
    users: dict[str, User] = field(default_factory=dict)
    loopback_users: frozenset[str] = frozenset({"guest"})

    @classmethod
    def with_default_user(cls) -> "UserStore":
        store = cls()
        store.add("guest", "guest", tags=("administrator",), vhosts={"/"})
        return store

    def add(self, name: str, password: str, tags=(), vhosts=("/",)) -> User:
        user = User(name, hash_password(password), tuple(tags), set(vhosts))
        self.users[name] = user
        return user

    def authenticate(self, username: str, password: str, peer_host: str) -> User | None:
        user = self.users.get(username)
        if user is None or not check_password(password, user.password_hash):
            return None
        if username in self.loopback_users and not is_loopback(peer_host):
            return None
        return user


class SaslError(ValueError):
    pass


def parse_sasl_response(mechanism: str, response: bytes) -> tuple[str, str]:
    """(username, password) from a start-ok response."""
    if mechanism == "PLAIN":
        parts = response.split(b"\x00")
        if len(parts) != 3:
            raise SaslError("malformed PLAIN response")
        _authzid, username, password = parts
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


__all__ = ["User", "UserStore", "hash_password", "check_password", "parse_sasl_response",
           "amqplain_response", "SaslError", "is_loopback"]
