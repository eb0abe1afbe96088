"""Certificates made at test time with the `openssl` command, for the TLS tests.

`make_pki(directory)` writes, as PEM files, a CA; a server certificate signed by it
for localhost and 127.0.0.1 (also usable by every node of a local cluster: it is a
client certificate too); a client certificate signed by it; an encrypted copy of
the server key (passphrase "secret"); and a second, unrelated CA with a server and
a client certificate of its own (the "wrong CA" a peer must be refused for). It
returns a `Pki` with their paths. Keys are EC (P-256): quick to make on a busy
machine.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

OPENSSL = "openssl"


@dataclass(frozen=True)
class Pki:
    ca: str
    server_cert: str
    server_key: str
    server_key_encrypted: str      # passphrase "secret"
    client_cert: str
    client_key: str
    other_ca: str
    other_server_cert: str
    other_server_key: str
    other_client_cert: str
    other_client_key: str


def _run(*arguments: str, cwd: str) -> None:
    subprocess.run([OPENSSL, *arguments], cwd=cwd, check=True, capture_output=True,
                   timeout=60)


def _ca(directory: str, name: str) -> None:
    _run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj",
         f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)


def _leaf(directory: str, ca: str, name: str) -> None:
    extensions = os.path.join(directory, f"{name}.ext")
    with open(extensions, "w") as handle:
        handle.write("basicConstraints=CA:FALSE\n"
                     "keyUsage=critical,digitalSignature,keyEncipherment\n"
                     "extendedKeyUsage=serverAuth,clientAuth\n"
                     "subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
         cwd=directory)
    _run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
         "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", extensions,
         cwd=directory)


def make_pki(directory: str) -> Pki:
    os.makedirs(directory, exist_ok=True)
    _ca(directory, "ca")
    _leaf(directory, "ca", "server")
    _leaf(directory, "ca", "client")
    _run("pkey", "-in", "server.key", "-out", "server-encrypted.key", "-aes256",
         "-passout", "pass:secret", cwd=directory)
    _ca(directory, "other-ca")
    _leaf(directory, "other-ca", "other-server")
    _leaf(directory, "other-ca", "other-client")
    path = lambda name: os.path.join(directory, name)  # noqa: E731
    return Pki(path("ca.pem"), path("server.pem"), path("server.key"),
               path("server-encrypted.key"), path("client.pem"), path("client.key"),
               path("other-ca.pem"), path("other-server.pem"), path("other-server.key"),
               path("other-client.pem"), path("other-client.key"))
