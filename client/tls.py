"""amqps:// for every client: pika connection parameters with TLS set up from files.

Responsibilities
    `connection_parameters(uri, tls)` is what every client connects with (the
    management RPC, the lease client, the connector): pika's `URLParameters` for an
    amqp:// or amqps:// URI, and for amqps:// an `ssl.SSLContext` built from
    `ClientTls` (the CA that signed the broker's certificate, a client certificate
    and key to present, whether to verify the broker) instead of pika's default
    (the system's CAs, no client certificate).

How it works
    The TLS settings come from a `ClientTls` (the connector's `tls.*` options) or
    from the URI's query, with the parameter names of RabbitMQ's URI spec ("URI
    query parameters": `cacertfile`, `certfile`, `keyfile`, `verify` =
    verify_peer | verify_none, `server_name_indication`), so a command line's
    `--uri "amqps://host:5671/%2F?cacertfile=/etc/ca.pem"` works as with
    RabbitMQ's own clients. The query parameters are taken out before pika reads
    the URI (pika refuses names it does not know). A setting given both ways must
    agree.

Invariants
    - verify (the default) checks the broker's certificate against the CA
      (`cacertfile`, else the system's CAs) and its name (the URI's host, or
      `server_name_indication`); verify_none checks neither and is explicit.
    - TLS settings on an amqp:// URI are refused (ValueError naming the setting),
      never ignored.
    - Errors are ValueError naming the setting; messages never hold a password.

Not here
    The broker's side (quorumqueue.broker.tls: RabbitMQ's ssl_options).
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field, fields, replace
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pika

# RabbitMQ's URI query parameters for TLS -> ClientTls field
URI_QUERY = {"cacertfile": "ca_file", "certfile": "cert_file", "keyfile": "key_file",
             "verify": "verify", "server_name_indication": "server_name"}


@dataclass(frozen=True, slots=True)
class ClientTls:
    ca_file: str = ""          # PEM CA(s) the broker's certificate must chain to; "": system
    cert_file: str = ""        # a client certificate to present (PEM), or ""
    key_file: str = ""         # its key; "": in cert_file
    key_password: str = field(default="", repr=False)
    verify: bool = True        # False: accept any server certificate (verify_none)
    server_name: str = ""      # the name checked and sent as SNI; "": the URI's host

    def context(self) -> ssl.SSLContext:
        """The SSLContext these settings describe (files read now)."""
        for name in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, name)
            if path and not os.path.isfile(path):
                raise ValueError(f"TLS {name}: {path} does not exist or is not a file")
        if self.key_file and not self.cert_file:
            raise ValueError("TLS key_file without cert_file")
        context = ssl.create_default_context(cafile=self.ca_file or None)
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.cert_file:
            try:
                context.load_cert_chain(self.cert_file, self.key_file or None,
                                        self.key_password or None)
            except ssl.SSLError as error:
                raise ValueError(f"TLS cert_file {self.cert_file}: cannot be used with "
                                 f"{self.key_file or 'the key in it'} "
                                 f"({error.reason or error})") from None
        return context


def split_uri(uri: str) -> tuple[str, ClientTls | None]:
    """`uri` without RabbitMQ's TLS query parameters, and the ClientTls they describe
    (None if the URI has none)."""
    parts = urlsplit(uri)
    query = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(name, value) for name, value in query if name not in URI_QUERY]
    given = {URI_QUERY[name]: value for name, value in query if name in URI_QUERY}
    if not given:
        return uri, None
    if "verify" in given:
        if given["verify"] not in ("verify_peer", "verify_none"):
            raise ValueError(f"URI query parameter verify: expected verify_peer or "
                             f"verify_none, got {given['verify']!r}")
        given["verify"] = given["verify"] == "verify_peer"
    return urlunsplit(parts._replace(query=urlencode(kept))), ClientTls(**given)


def _merge(from_uri: ClientTls | None, tls: ClientTls | None) -> ClientTls | None:
    if from_uri is None or tls is None:
        return from_uri or tls
    default = ClientTls()
    merged = {}
    for item in fields(ClientTls):
        mine, theirs = getattr(from_uri, item.name), getattr(tls, item.name)
        if mine != getattr(default, item.name) and theirs != getattr(default, item.name) \
                and mine != theirs:
            raise ValueError(f"TLS {item.name} is given twice, differently: in the URI's "
                             "query and as an option")
        merged[item.name] = theirs if theirs != getattr(default, item.name) else mine
    return replace(default, **merged)


def connection_parameters(uri: str, tls: ClientTls | None = None) -> pika.URLParameters:
    """pika's parameters for `uri`, TLS set up from `tls` and the URI's query."""
    plain_uri, from_uri = split_uri(uri)
    settings = _merge(from_uri, tls)
    scheme = urlsplit(uri).scheme.lower()
    if settings is not None and scheme != "amqps":
        raise ValueError("TLS settings (CA, certificate, verify) need an amqps:// URI, "
                         f"not {scheme}://")
    parameters = pika.URLParameters(plain_uri)
    if scheme == "amqps":
        settings = settings or ClientTls()
        parameters.ssl_options = pika.SSLOptions(settings.context(),
                                                 settings.server_name or None)
    return parameters


__all__ = ["ClientTls", "connection_parameters", "split_uri"]
