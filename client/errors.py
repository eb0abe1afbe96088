"""What every management client raises and how it names a node: shared by the AMQP
management RPC client (management.py, pika) and the HTTP one (http_management.py,
the command line's), so the command line imports no AMQP client at all.

`ManagementError`: a refusal or an unreachable node, its text fit to print (RabbitMQ's
`NAME - detail` when the node gave one). `redact_uri`: a URI with its password
replaced by `***`, for messages.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


class ManagementError(RuntimeError):
    pass


def redact_uri(uri: str) -> str:
    """`uri` with its password replaced by `***`, fit for an error message."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))
