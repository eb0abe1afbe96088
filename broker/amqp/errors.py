"""AMQP errors as exceptions raised by the pure cores and turned into close methods.

An `AMQPError` carries the reply code, the detail text and the failing method's
class/method ids. Its `reply_text` is RabbitMQ's `NAME - detail` form. Whether it
closes the channel or the connection follows from the code (spec.CHANNEL_LEVEL_CODES)
unless `connection_level` forces it (RabbitMQ closes the connection for some codes
that are otherwise soft, e.g. 403 on vhost access during connection.open).
"""

from __future__ import annotations

from . import spec


class AMQPError(Exception):
    def __init__(self, code: int, detail: str, class_id: int = 0, method_id: int = 0,
                 *, connection_level: bool | None = None) -> None:
        super().__init__(code, detail)
        self.code = code
        self.detail = detail
        self.class_id = class_id
        self.method_id = method_id
        self.connection_level = (code not in spec.CHANNEL_LEVEL_CODES
                                 if connection_level is None else connection_level)

    @property
    def reply_text(self) -> str:
        return f"{spec.REPLY_NAMES[self.code]} - {self.detail}"

    def at(self, class_id: int, method_id: int) -> "AMQPError":
        """Attach the failing method's ids when the raiser did not know them."""
        if not self.class_id:
            self.class_id, self.method_id = class_id, method_id
        return self

    def __str__(self) -> str:
        return self.reply_text


def not_found(what: str, name: str, vhost: str) -> AMQPError:
    return AMQPError(spec.NOT_FOUND, f"no {what} '{name}' in vhost '{vhost}'")


def precondition(detail: str) -> AMQPError:
    return AMQPError(spec.PRECONDITION_FAILED, detail)


def access_refused(detail: str) -> AMQPError:
    return AMQPError(spec.ACCESS_REFUSED, detail)


def resource_refused(kind: str, name: str, vhost: str, user: str) -> AMQPError:
    """A permission check failed (rabbit_access_control in RabbitMQ 3.x): `kind` is
    "queue" or "exchange"."""
    return access_refused(f"access to {kind} '{name}' in vhost '{vhost}' refused for "
                          f"user '{user}'")


# RabbitMQ's hard limit on max_message_size (rabbit.hrl ?MAX_MSG_SIZE, 512 MiB)
MAX_MESSAGE_SIZE = 512 * 1024 * 1024


def message_too_large(size: int, limit: int) -> AMQPError:
    """A basic.publish whose body is over `limit` (rabbit_channel:check_msg_size:
    "configured" unless the limit is the hard one)."""
    configured = "" if limit == MAX_MESSAGE_SIZE else "configured "
    return AMQPError(spec.PRECONDITION_FAILED, f"message size {size} is larger than "
                     f"{configured}max size {limit}", *spec.BASIC_PUBLISH)
