"""The names corpus: queue, exchange, vhost and user names with any UTF-8 character,
through every HTTP API endpoint that takes a name and the command line's commands.

RabbitMQ takes any UTF-8 string of up to 255 bytes as a name (the queues guide,
"Names"); its management API and rabbitmqctl take them as they are, URL-quoted. A
name here is exercised as a real operator or script would: a vhost and a user of
that name, the user's permissions in it, a queue and an exchange of that name in it,
a binding between them, a publish, a get, a purge, the listings, then every delete;
and the same queue through `quorumqueue queues list/purge/delete` and the user and
vhost through `quorumqueue ctl`. Each step expects RabbitMQ 3.10.8's status (201,
200, 204) and the name back unchanged in the JSON. `--rabbitmq` runs the same steps
against RabbitMQ 3.10.8's management plugin, which is how the expectations were
checked.

    python -m tests.faults.names --count 500 --seed 7            # quorumqueue
    python -m tests.faults.names --count 100 --seed 7 --rabbitmq  # the oracle too

The short seeded form (FIXED and a few random names) runs in `make test`
(tests/broker/management/test_names.py), the long form in `make faults`.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import quote

# The names of the issue (answered 500 before: a client-side name check), then the
# characters URLs, JSON, shells and HTML treat specially.
FIXED = (
    "café", "q(1)", "it's", "a/b", "sp ace", "🐇", "%2F", "a%b", "q?x=1&y=2", "#hash",
    "semi;colon", "plus+sign", "quote\"d", "<b>bold</b>", "back\\slash", "日本語のキュー",
    "über-ünïcödé", "Ελληνικά", "עברית", "emoji 🐇🥕", "tab\there", "e\u0301", "~tilde`",
    "[brackets]{braces}|pipe", "@at:colon", "*star", "dollar$", "ünicode/with/slashes",
)

# What random names are drawn from: printable ASCII (without NUL, which RabbitMQ's
# names may hold but URLs and C strings do not carry well), Latin-1, Greek, Hebrew,
# CJK, combining marks, emoji and other characters outside the BMP.
_ALPHABETS = (
    "".join(chr(c) for c in range(0x20, 0x7F)),
    "".join(chr(c) for c in range(0xA0, 0x100)),
    "".join(chr(c) for c in range(0x391, 0x3CA)),
    "".join(chr(c) for c in range(0x5D0, 0x5EB)),
    "".join(chr(c) for c in range(0x4E00, 0x4E80)),
    "".join(chr(c) for c in range(0x300, 0x320)),
    "".join(chr(c) for c in range(0x1F400, 0x1F440)),
    "\t\u00ad\u200b\u2028\ufeff\U00010348\U0002000b",
)
MAX_NAME_BYTES = 255


def random_names(seed: int, count: int) -> list[str]:
    """`count` names of 1-24 characters, none starting with the reserved `amq.`."""
    rng = random.Random(seed)
    names: list[str] = []
    while len(names) < count:
        length = rng.randint(1, 24)
        name = "".join(rng.choice(rng.choice(_ALPHABETS)) for _ in range(length))
        if name.startswith("amq.") or name in (".", "..") or name in names:
            continue
        while len(name.encode()) > MAX_NAME_BYTES - 4:  # room for the kind's suffix
            name = name[:-1]
        names.append(name)
    return names


@dataclass
class Target:
    """A management API: its base URL and an administrator's credentials."""
    base_url: str
    username: str = "guest"
    password: str = "guest"
    cli_port: int | None = None   # the port `quorumqueue` commands get (None: no CLI)

    def call(self, method: str, *segments: str, body=None, query: str = "",
             user: tuple[str, str] | None = None) -> tuple[int, object]:
        path = "/api/" + "/".join(quote(s, safe="") for s in segments) + query
        data = json.dumps(body).encode() if body is not None else None
        username, password = user or (self.username, self.password)
        headers = {"Authorization": "Basic " + base64.b64encode(
            f"{username}:{password}".encode()).decode()}
        if data is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.base_url + path, data=data, method=method,
                                         headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                raw, status = response.read(), response.status
        except urllib.error.HTTPError as error:
            raw, status = error.read(), error.code
        try:
            return status, json.loads(raw) if raw.strip() else None
        except ValueError:
            return status, raw.decode(errors="replace")


@dataclass
class Report:
    names: int = 0
    steps: int = 0
    failures: list[str] = field(default_factory=list)

    def check(self, name: str, step: str, ok: bool, detail: object = "") -> bool:
        self.steps += 1
        if not ok:
            self.failures.append(f"{name!r}: {step}: {detail}")
        return ok


def exercise(target: Target, name: str, report: Report) -> None:
    """Every step for `name` (as a vhost, a user, a queue and an exchange)."""
    report.names += 1
    vhost, user, queue, exchange = name + " vh", name + " u", name, name + " x"
    call = target.call

    def expect(step: str, answer: tuple[int, object], *statuses: int) -> object:
        status, body = answer
        report.check(name, step, status in statuses, f"{status} {body!r:.200}")
        return body

    expect("PUT vhost", call("PUT", "vhosts", vhost, body={}), 201, 204)
    body = expect("GET vhost", call("GET", "vhosts", vhost), 200)
    report.check(name, "vhost name round trip", isinstance(body, dict)
                 and body.get("name") == vhost, body)
    expect("PUT user", call("PUT", "users", user, body={"password": "pw",
                                                        "tags": "management"}), 201, 204)
    body = expect("GET user", call("GET", "users", user), 200)
    report.check(name, "user name round trip", isinstance(body, dict)
                 and body.get("name") == user, body)
    expect("PUT permissions", call("PUT", "permissions", vhost, user, body={
        "configure": ".*", "write": ".*", "read": ".*"}), 201, 204)
    body = expect("GET permissions", call("GET", "permissions", vhost, user), 200)
    report.check(name, "permissions round trip", isinstance(body, dict)
                 and body.get("user") == user and body.get("vhost") == vhost, body)
    if ":" not in user:  # basic auth cannot carry a colon in the user name
        body = expect("GET whoami as the user", call("GET", "whoami", user=(user, "pw")), 200)
        report.check(name, "logged in as the user", isinstance(body, dict)
                     and body.get("name") == user, body)

    expect("PUT queue", call("PUT", "queues", vhost, queue, body={"durable": True}), 201, 204)
    body = expect("GET queue", call("GET", "queues", vhost, queue), 200)
    report.check(name, "queue name round trip", isinstance(body, dict)
                 and body.get("name") == queue and body.get("vhost") == vhost, body)
    body = expect("GET queues of the vhost", call("GET", "queues", vhost), 200)
    report.check(name, "queue listed", isinstance(body, list)
                 and any(row.get("name") == queue for row in body), body)
    expect("PUT exchange", call("PUT", "exchanges", vhost, exchange, body={
        "type": "direct"}), 201, 204)
    body = expect("GET exchange", call("GET", "exchanges", vhost, exchange), 200)
    report.check(name, "exchange name round trip", isinstance(body, dict)
                 and body.get("name") == exchange, body)
    expect("POST binding", call("POST", "bindings", vhost, "e", exchange, "q", queue,
                                body={"routing_key": name}), 201)
    body = expect("GET bindings", call("GET", "bindings", vhost, "e", exchange, "q", queue),
                  200)
    keys = [row.get("properties_key") for row in body] if isinstance(body, list) else []
    report.check(name, "binding listed", len(keys) == 1 and all(keys), body)
    body = expect("GET queue bindings", call("GET", "queues", vhost, queue, "bindings"), 200)
    report.check(name, "queue's bindings name the exchange", isinstance(body, list)
                 and any(row.get("source") == exchange for row in body), body)
    body = expect("POST publish", call("POST", "exchanges", vhost, exchange, "publish", body={
        "properties": {}, "routing_key": name, "payload": name, "payload_encoding": "string"}),
        200)
    report.check(name, "published and routed", body == {"routed": True}, body)
    body = expect("POST get", call("POST", "queues", vhost, queue, "get", body={
        "count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}), 200)
    report.check(name, "got the message back", isinstance(body, list) and len(body) == 1
                 and body[0].get("payload") == name and body[0].get("routing_key") == name
                 and body[0].get("exchange") == exchange, body)
    expect("DELETE contents (purge)", call("DELETE", "queues", vhost, queue, "contents"), 204)
    if keys and keys[0]:
        expect("DELETE binding", call("DELETE", "bindings", vhost, "e", exchange, "q", queue,
                                      keys[0]), 204)
    expect("DELETE exchange", call("DELETE", "exchanges", vhost, exchange), 204)
    expect("DELETE queue", call("DELETE", "queues", vhost, queue), 204)
    expect("GET deleted queue", call("GET", "queues", vhost, queue), 404)

    if target.cli_port is not None:
        _command_line(target, name, vhost, queue, report)

    expect("DELETE permissions", call("DELETE", "permissions", vhost, user), 204)
    expect("DELETE user", call("DELETE", "users", user), 204)
    expect("DELETE vhost", call("DELETE", "vhosts", vhost), 204)
    expect("GET deleted vhost", call("GET", "vhosts", vhost), 404)


def _command_line(target: Target, name: str, vhost: str, queue: str, report: Report) -> None:
    """The same names through `quorumqueue queues ...` and `quorumqueue ctl ...`."""
    from click.testing import CliRunner

    from quorumqueue.cli.main import main

    options = ["--port", str(target.cli_port), "--username", target.username,
               "--password", target.password]
    runner = CliRunner()

    def run(step: str, *arguments: str) -> str:
        result = runner.invoke(main, list(arguments[:2]) + options + list(arguments[2:]))
        report.check(name, f"quorumqueue {step}", result.exit_code == 0,
                     f"exit {result.exit_code}: {result.output!r:.300}")
        return result.output

    cli_vhost, cli_user = name + " cli", name + " cliuser"
    run("ctl add_vhost", "ctl", "add_vhost", cli_vhost)
    run("ctl add_user", "ctl", "add_user", cli_user, "pw")
    run("ctl set_permissions", "ctl", "set_permissions", "-p", cli_vhost, cli_user,
        ".*", ".*", ".*")
    # add_vhost gives nobody permissions (rabbitmqctl's): the administrator too
    run("ctl set_permissions (administrator)", "ctl", "set_permissions", "-p", cli_vhost,
        target.username, ".*", ".*", ".*")
    listed = run("ctl list_user_permissions", "ctl", "list_user_permissions", cli_user)
    report.check(name, "list_user_permissions shows the vhost", cli_vhost in listed, listed)
    status, _ = target.call("PUT", "queues", cli_vhost, queue, body={"durable": True})
    report.check(name, "PUT queue (for the CLI)", status in (201, 204), status)
    listed = run("queues list", "queues", "list", "-p", cli_vhost)
    report.check(name, "queues list shows the queue", queue in listed, listed)
    run("queues purge", "queues", "purge", "-p", cli_vhost, queue)
    run("queues delete", "queues", "delete", "-p", cli_vhost, queue)
    run("ctl clear_permissions", "ctl", "clear_permissions", "-p", cli_vhost, cli_user)
    run("ctl delete_user", "ctl", "delete_user", cli_user)
    run("ctl delete_vhost", "ctl", "delete_vhost", cli_vhost)


def run_corpus(target: Target, names: list[str]) -> Report:
    report = Report()
    for name in names:
        exercise(target, name, report)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=500, help="random names (plus FIXED)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rabbitmq", action="store_true",
                        help="run the corpus against RabbitMQ 3.10.8 as well")
    args = parser.parse_args(argv)
    names = list(FIXED) + random_names(args.seed, args.count)
    from tests.support.broker import BrokerProcess

    failed = False
    began = time.monotonic()
    with BrokerProcess() as broker:
        _wait_serving(broker.management_url)
        report = run_corpus(Target(broker.management_url, cli_port=broker.management_port),
                            names)
    failed |= _print("quorumqueue", report, time.monotonic() - began)
    if args.rabbitmq:
        from tests.support.broker import free_port
        from tests.support.rabbitmq import RabbitMQNode

        port = free_port()
        began = time.monotonic()
        with RabbitMQNode(plugins=("rabbitmq_management",),
                          extra_config=f"management.tcp.port = {port}\n"
                                       "management.tcp.ip = 127.0.0.1\n"):
            url = f"http://127.0.0.1:{port}"
            _wait_serving(url)
            # the command line is quorumqueue's: only the HTTP steps go to RabbitMQ
            report = run_corpus(Target(url), names)
        failed |= _print("RabbitMQ 3.10.8", report, time.monotonic() - began)
    print(f"reproduce: python -m tests.faults.names --count {args.count} --seed {args.seed}"
          + (" --rabbitmq" if args.rabbitmq else ""))
    return 1 if failed else 0


def _wait_serving(url: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            Target(url).call("GET", "overview")
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _print(who: str, report: Report, seconds: float) -> bool:
    print(f"{who}: {report.names} names, {report.steps} steps, {len(report.failures)} "
          f"failed ({seconds:.0f} s)")
    for failure in report.failures[:40]:
        print("  " + failure)
    return bool(report.failures)


if __name__ == "__main__":
    sys.exit(main())
