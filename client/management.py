"""Client side of the management RPC, over pika: one request, one answer.

The wire form is docs/behaviour/management-rpc.md's "Management RPC (wire form)": a publish to the
default exchange with routing key `amq.quorumqueue.management`, answered on direct
reply-to. The broker checks each operation's own rights (the administrator tag, or
read on the queue for lease operations); publishing the request needs no write
permission on the default exchange. `redact_uri` keeps passwords out of messages.
"""

from __future__ import annotations

import json
import ssl
import time
import uuid
import pika

from .errors import ManagementError, redact_uri  # noqa: F401 - importers use them here
from .tls import ClientTls, connection_parameters

ROUTING_KEY = "amq.quorumqueue.management"
REPLY_TO = "amq.rabbitmq.reply-to"




def call(uri: str, op: str, timeout: float = 10.0, tls: ClientTls | None = None,
         fields: dict | None = None, **arguments) -> object:
    """Send one request and return its result; raises ManagementError on refusal.
    An amqps:// URI connects over TLS (tls.py: `tls`, or the URI's cacertfile...).
    `timeout` is this call's wait for the answer; `fields` holds arguments whose
    names this function takes itself (a membership command's own `timeout`)."""
    arguments = {**(fields or {}), **arguments}
    try:
        connection = pika.BlockingConnection(connection_parameters(uri, tls))
    except (ValueError, ssl.SSLError) as error:  # TLS settings or a refused certificate
        raise ManagementError(f"{redact_uri(uri)}: {error}") from None
    except pika.exceptions.AMQPConnectionError as error:
        raise ManagementError(f"cannot connect to {redact_uri(uri)}: {error!r}. Is the "
                              "broker running? Start it with `quorumqueue broker start`."
                              ) from None
    try:
        channel = connection.channel()
        replies: list[bytes] = []
        correlation_id = uuid.uuid4().hex
        channel.basic_consume(REPLY_TO, lambda ch, m, p, body: replies.append(body)
                              if p.correlation_id == correlation_id else None, auto_ack=True)
        channel.basic_publish("", ROUTING_KEY, json.dumps({"op": op, **arguments}).encode(),
                              pika.BasicProperties(reply_to=REPLY_TO,
                                                   correlation_id=correlation_id,
                                                   content_type="application/json"))
        connection.process_data_events(time_limit=0)
        deadline = time.monotonic() + timeout
        while not replies and time.monotonic() < deadline:
            connection.process_data_events(time_limit=0.1)
        if not replies:
            raise ManagementError(f"no reply to '{op}' within {timeout}s")
        answer = json.loads(replies[0])
    finally:
        connection.close()
    if not answer.get("ok"):
        raise ManagementError(answer.get("error", "unknown error"))
    return answer["result"]
