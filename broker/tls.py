"""TLS settings in RabbitMQ's `ssl_options.*` form, validated once, and the
`ssl.SSLContext`s built from them.

Responsibilities
    `parse_tls(prefix, pairs)` reads one group of RabbitMQ-style TLS keys
    (`ssl_options.certfile`, `cluster.tls.cacertfile`, `management.ssl.keyfile`...)
    into a frozen `TlsOptions`, refusing unknown keys and impossible values with a
    `ConfigError` naming the key. `server_context` and `client_context` turn a
    `TlsOptions` into a stdlib `ssl.SSLContext` (asyncio's servers and connections
    take it as `ssl=`), reading the files at once so a missing file, a key that does
    not match its certificate or a wrong password fails at start, naming the key.

How it works
    The keys and their meaning are RabbitMQ's (its TLS guide, "Enabling TLS Support
    in RabbitMQ"): `cacertfile`, `certfile`, `keyfile`, `password`, `verify`
    (`verify_peer` checks the peer's certificate against `cacertfile`; `verify_none`
    does not ask for one), `fail_if_no_peer_cert` (with verify_peer: a peer without a
    certificate is refused; without it a peer may present none), `versions.N`
    (`tlsv1.2`, `tlsv1.3`: the lowest and highest allowed bound the handshake) and
    `ciphers.N` (OpenSSL cipher names, as rabbitmq.conf lists them; they govern
    TLS 1.2, OpenSSL fixes TLS 1.3's suites). A group's prefix is carried so every
    message names the key as the file spells it.

    Any HTTP server (the management API's `management.ssl.*`) reuses this:
    `server_context(parse_tls("management.ssl", pairs))`.

Invariants
    - A `TlsOptions` holds only values that passed validation; `server_context`
      and `client_context` raise `ConfigError` naming the key for anything the files
      make impossible, never a bare `ssl.SSLError`.
    - verify_peer always has a CA to check against (`cacertfile`);
      `fail_if_no_peer_cert` is only accepted with verify_peer.

Not here
    `depth` (Python's ssl module cannot bound a chain's length: refused rather than
    ignored), certificate-based login (the EXTERNAL mechanism is not offered),
    certificate revocation lists, reloading certificates without a restart.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field

from .config_values import ConfigError

VERSIONS = {"tlsv1.2": ssl.TLSVersion.TLSv1_2, "tlsv1.3": ssl.TLSVersion.TLSv1_3}
# versions rabbitmq.conf may name that OpenSSL's defaults here no longer allow
OLD_VERSIONS = ("tlsv1", "tlsv1.1", "sslv3")


@dataclass(frozen=True, slots=True)
class TlsOptions:
    prefix: str = "ssl_options"   # how the file spells the group: names keys in errors
    cacertfile: str = ""          # the CA(s) peers' certificates are checked against
    certfile: str = ""            # this side's certificate (chain), PEM
    keyfile: str = ""             # its private key, PEM; "" if certfile holds it
    password: str = field(default="", repr=False)   # the key's passphrase, if encrypted
    verify_peer: bool = False     # RabbitMQ's `verify`: verify_peer (True) | verify_none
    fail_if_no_peer_cert: bool = False   # only with verify_peer
    versions: tuple[str, ...] = ()       # subset of VERSIONS; () = both
    ciphers: tuple[str, ...] = ()        # OpenSSL names (TLS 1.2); () = OpenSSL's default
    configured: bool = False      # the file set at least one key of this group

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}"


def _numbered(key: str, value, base: str, pairs: dict) -> None:
    """`versions.1 = "tlsv1.2"` and `versions = ["tlsv1.2", ...]` alike."""
    if isinstance(value, list):
        for index, item in enumerate(value, 1):
            pairs.setdefault(base, []).append((f"{key}.{index}", item))
    else:
        pairs.setdefault(base, []).append((key, value))


def parse_tls(prefix: str, pairs, *, server: bool = True) -> TlsOptions:
    """The group `prefix` from (dotted key, value) pairs of the configuration file
    (keys with the prefix, e.g. "ssl_options.certfile"). `server`: the group
    configures a listener (fail_if_no_peer_cert is a server's key)."""
    fields: dict = {"prefix": prefix, "configured": bool(pairs)}
    lists: dict = {}
    for key, value in pairs:
        name = key[len(prefix) + 1:]
        base = name.split(".", 1)[0]
        if base in ("versions", "ciphers") and (name == base or name[len(base) + 1:].isdigit()):
            _numbered(key, value, base, lists)
            continue
        if name in ("cacertfile", "certfile", "keyfile", "password"):
            if not isinstance(value, str) or (name != "password" and not value):
                raise ConfigError(f"{key}: expected a file path, got {value!r}")
            if name != "password" and not os.path.isfile(value):
                raise ConfigError(f"{key}: {value} does not exist or is not a file")
            fields[name] = value
        elif name == "verify":
            if value not in ("verify_peer", "verify_none"):
                raise ConfigError(f"{key}: expected verify_peer or verify_none, got {value!r}")
            fields["verify_peer"] = value == "verify_peer"
        elif name == "fail_if_no_peer_cert" and server:
            if not isinstance(value, bool):
                raise ConfigError(f"{key}: expected true or false, got {value!r}")
            fields["fail_if_no_peer_cert"] = value
        elif name == "depth":
            raise ConfigError(f"{key}: not supported (Python's ssl module cannot bound the "
                              "length of a certificate chain); remove it")
        else:
            known = ["cacertfile", "certfile", "keyfile", "password", "verify",
                     "versions.N", "ciphers.N"] + (["fail_if_no_peer_cert"] if server else [])
            raise ConfigError(f"unknown key '{key}' (known keys of {prefix}: "
                              f"{', '.join(known)})")
    versions = []
    for key, value in lists.get("versions", []):
        if value in OLD_VERSIONS:
            raise ConfigError(f"{key}: {value} is not supported (OpenSSL here allows "
                              "tlsv1.2 and tlsv1.3 only)")
        if value not in VERSIONS:
            raise ConfigError(f"{key}: expected tlsv1.2 or tlsv1.3, got {value!r}")
        versions.append(value)
    fields["versions"] = tuple(sorted(set(versions)))
    ciphers = []
    for key, value in lists.get("ciphers", []):
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{key}: expected an OpenSSL cipher suite name, got {value!r}")
        ciphers.append(value)
    fields["ciphers"] = tuple(ciphers)
    options = TlsOptions(**fields)
    if options.fail_if_no_peer_cert and not options.verify_peer:
        raise ConfigError(f"{options.key('fail_if_no_peer_cert')}: true needs "
                          f"{options.key('verify')} = verify_peer (with verify_none no "
                          "certificate is asked for)")
    if options.verify_peer and not options.cacertfile:
        raise ConfigError(f"{options.key('verify')}: verify_peer needs "
                          f"{options.key('cacertfile')}, the CA peers' certificates are "
                          "checked against")
    if options.keyfile and not options.certfile:
        raise ConfigError(f"{options.key('keyfile')}: set {options.key('certfile')} too")
    return options


def _common(context: ssl.SSLContext, options: TlsOptions) -> ssl.SSLContext:
    if options.versions:
        context.minimum_version = VERSIONS[options.versions[0]]
        context.maximum_version = VERSIONS[options.versions[-1]]
    else:
        context.minimum_version = ssl.TLSVersion.TLSv1_2
    if options.ciphers:
        try:
            context.set_ciphers(":".join(options.ciphers))
        except ssl.SSLError:
            raise ConfigError(f"{options.key('ciphers')}: OpenSSL knows none of "
                              f"{', '.join(options.ciphers)}") from None
    if options.cacertfile:
        try:
            context.load_verify_locations(cafile=options.cacertfile)
        except ssl.SSLError as error:
            raise ConfigError(f"{options.key('cacertfile')}: {options.cacertfile} holds no "
                              f"PEM certificate OpenSSL can read ({error.reason or error})"
                              ) from None
    if options.certfile:
        try:
            context.load_cert_chain(options.certfile, options.keyfile or None,
                                    options.password or None)
        except ssl.SSLError as error:
            raise ConfigError(f"{options.key('keyfile')}: cannot use {options.certfile} "
                              f"with {options.keyfile or 'the key in it'}: the key does not "
                              f"match the certificate, is not PEM, or "
                              f"{options.key('password')} is wrong ({error.reason or error})"
                              ) from None
    return context


def server_context(options: TlsOptions) -> ssl.SSLContext:
    """The context a listener wraps its connections in (AMQP's listeners.ssl, the
    management API's management.ssl): needs a certificate and key."""
    if not options.certfile:
        raise ConfigError(f"{options.key('certfile')}: a TLS listener needs a certificate "
                          f"(and {options.key('keyfile')})")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _common(context, options)
    if not options.verify_peer:
        context.verify_mode = ssl.CERT_NONE
    elif options.fail_if_no_peer_cert:
        context.verify_mode = ssl.CERT_REQUIRED
    else:
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


def client_context(options: TlsOptions, check_hostname: bool = True) -> ssl.SSLContext:
    """The context a connecting side uses: verify_peer checks the server's certificate
    against cacertfile (and its name, with `check_hostname`); certfile, if set, is
    presented to the server."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _common(context, options)
    if options.verify_peer:
        context.check_hostname = check_hostname
        context.verify_mode = ssl.CERT_REQUIRED
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


__all__ = ["TlsOptions", "parse_tls", "server_context", "client_context", "VERSIONS"]
