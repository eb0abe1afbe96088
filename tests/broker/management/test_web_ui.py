"""The management web UI (broker/management/ui/) in a real browser: headless Chromium
(Debian's `chromium` package, installed by .ci/install-chromium) driven by Playwright.

A user logs in, reads a quorum queue's ready count and message rates on the queues
page after publishing with pika, its publish and get counts on its page, purges the queue from its page and sees 0; the API agrees. An operator lists a lease on the Leases
page and releases it there.
Screenshots go to test-artifacts/web-ui/ at the repository root (ignored by git;
tests/README.md). Without Chromium or Playwright the browser test is skipped with
the reason (never passed silently); the plain-HTTP tests of the served files always
run.
"""

from __future__ import annotations

import os
import re
import shutil
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pika
import pytest

from tests.support.broker import BrokerProcess

from .support import WAIT, call, wait_for, wait_until_serving

ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = Path(os.environ.get("QUORUMQUEUE_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "web-ui"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def broker():
    # rates sampled every second so the overview's chart gets points during the test
    with BrokerProcess(extra_config="collect_statistics_interval = 1000\n") as process:
        wait_until_serving(process.management_url)
        yield process


def fetch(url: str) -> tuple[int, str, str]:
    """(status, content type, body) of a GET without credentials."""
    try:
        with urllib.request.urlopen(url, timeout=WAIT) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


# ---------------------------------------------------------------- the files, over HTTP


def test_the_page_and_its_files_are_served_without_login(broker):
    base = broker.management_url
    status, kind, body = fetch(base + "/")
    assert status == 200 and kind.startswith("text/html")
    assert '<script src="/ui/app.js">' in body
    for name, kind_wanted in (("app.js", "text/javascript"), ("ratechart.js", "text/javascript"),
                              ("style.css", "text/css")):
        status, kind, _ = fetch(f"{base}/ui/{name}")
        assert (status, kind.split(";")[0]) == (200, kind_wanted), name
    # only the UI's own files: no way out of ui/, no Python source
    for path in ("/ui/../app.py", "/ui/%2E%2E/app.py", "/ui/missing.js", "/app.py"):
        assert fetch(base + path)[0] == 404, path
    # the API still wants credentials
    assert fetch(base + "/api/overview")[0] == 401


# ---------------------------------------------------------------- in a browser


def _browser(playwright):
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed and .ci/install-chromium could not "
                    "install it here (it needs root and apt-get): the web UI's browser test "
                    "did NOT run")
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                      args=["--no-sandbox"])


def _playwright():
    """Playwright's sync API (expect, sync_playwright), or a skip naming what is missing."""
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        pytest.skip("Playwright is not installed (pip install -e '.[dev]'): the web UI's "
                    "browser test did NOT run")
    return expect, sync_playwright


def _quorum_queue_with(broker, prefix: str, count: int) -> str:
    queue = f"{prefix}-{uuid.uuid4().hex[:8]}"
    connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        channel.confirm_delivery()
        for number in range(count):
            channel.basic_publish("", queue, f"message {number}".encode())
    finally:
        connection.close()
    return queue


def _page(browser, script_errors: list[str]):
    """A page that accepts confirmations (purge, release) and records script errors,
    the Content-Security-Policy's refusals among them (management/security.py: Chromium
    reports them on the console)."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(WAIT * 1000)
    page.on("dialog", lambda dialog: dialog.accept())
    page.on("pageerror", lambda error: script_errors.append(str(error)))
    page.on("console", lambda message: script_errors.append(message.text)
            if "Content Security Policy" in message.text else None)
    return page


def test_login_read_a_queue_purge_it_in_the_browser(broker):
    expect, sync_playwright = _playwright()
    base = broker.management_url
    queue = _quorum_queue_with(broker, "ui", 7)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "failure.png").unlink(missing_ok=True)
    timeout_ms = WAIT * 1000

    with sync_playwright() as playwright:
        browser = _browser(playwright)
        script_errors: list[str] = []
        page = _page(browser, script_errors)
        try:
            page.goto(base + "/")
            # wrong password: refused, the form stays
            page.fill("#username", "guest")
            page.fill("#password", "wrong")
            page.click("#login")
            expect(page.locator("#error")).to_have_text("Login failed", timeout=timeout_ms)
            page.fill("#password", "guest")
            page.click("#login")
            expect(page.locator("h1")).to_contain_text("Overview", timeout=timeout_ms)
            expect(page.locator("#rates-chart")).to_be_visible(timeout=timeout_ms)
            expect(page.locator("#who")).to_have_text("guest", timeout=timeout_ms)
            # the overview's message_stats rates arrive (the chart's data)
            expect(page.locator("#total-publish")).to_contain_text("/s", timeout=timeout_ms)
            expect(page.locator("#rates-chart")).to_have_attribute(
                "data-points", re.compile(r"^[1-9]"), timeout=timeout_ms)
            page.screenshot(path=str(ARTIFACTS / "overview.png"), full_page=True)

            page.click("#nav a[href='#/queues']")
            row = page.locator(f"tr[data-queue='{queue}']")
            expect(row.locator("td.ready")).to_have_text("7", timeout=timeout_ms)
            expect(row).to_contain_text("quorum")
            # RabbitMQ's "Message rates" columns: incoming, deliver / get, ack
            for column in ("incoming", "deliver-get", "ack"):
                expect(row.locator(f"td.{column}")).to_contain_text("/s", timeout=timeout_ms)
            page.screenshot(path=str(ARTIFACTS / "queues.png"), full_page=True)

            row.locator("a").click()
            expect(page.locator("h1")).to_contain_text(queue, timeout=timeout_ms)
            expect(page.locator("#q-ready")).to_have_text("7", timeout=timeout_ms)
            leader = page.locator("#queue-members tr[data-member] td.raft-state")
            expect(leader).to_have_text("leader", timeout=timeout_ms)
            # the queue's message rates and counts: the 7 publishes
            expect(page.locator("#q-count-publish")).to_have_text("7", timeout=timeout_ms)
            expect(page.locator("#q-rate-publish")).to_contain_text("/s", timeout=timeout_ms)
            expect(page.locator("#q-count-get")).to_have_text("0")
            # get one message back (requeued): its body shows, the count stays, and
            # the queue's get count moves
            page.click("#get")
            expect(page.locator("#got pre.payload")).to_have_text("message 0",
                                                                  timeout=timeout_ms)
            expect(page.locator("#q-count-get")).to_have_text("1", timeout=timeout_ms)
            page.click("#purge")
            expect(page.locator("#q-ready")).to_have_text("0", timeout=timeout_ms)
            expect(page.locator("#q-total")).to_have_text("0", timeout=timeout_ms)
            page.screenshot(path=str(ARTIFACTS / "queue-purged.png"), full_page=True)

            # the read-only lists
            page.click("#nav a[href='#/exchanges']")
            expect(page.locator("main")).to_contain_text("amq.topic", timeout=timeout_ms)
            page.click("#nav a[href='#/connections']")
            expect(page.locator("h1")).to_have_text("Connections", timeout=timeout_ms)
            page.click("#nav a[href='#/admin']")
            expect(page.locator("main table").first).to_contain_text("administrator",
                                                                     timeout=timeout_ms)
            page.screenshot(path=str(ARTIFACTS / "admin.png"), full_page=True)
            # logging out forgets the credentials
            page.click("#logout")
            expect(page.locator("#login")).to_be_visible(timeout=timeout_ms)
            assert page.evaluate("sessionStorage.length") == 0
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "failure.png"), full_page=True)
            raise
        finally:
            browser.close()

    assert script_errors == []
    # what the page showed is what the broker holds
    row = wait_for(lambda: call(base, "GET", f"/api/queues/%2F/{queue}")[1], "the queue")
    assert (row["messages_ready"], row["messages"]) == (0, 0)
    assert (ARTIFACTS / "queue-purged.png").stat().st_size > 0


def test_an_operator_lists_and_releases_a_lease_in_the_browser(broker):
    """The Leases page (docs/behaviour/leases.md): a lease left holding 4 messages by a
    query that ended is listed with its state and messages; Release gives them back to
    the queue and the row turns fenced; the API agrees."""
    expect, sync_playwright = _playwright()
    from quorumqueue.client.lease_client import LeaseClient

    base = broker.management_url
    queue, lease = _quorum_queue_with(broker, "ui-leases", 4), "spark-ui"
    with LeaseClient(broker.uri) as client:
        client.grow(queue, lease, max_messages=4)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    timeout_ms = WAIT * 1000
    with sync_playwright() as playwright:
        browser = _browser(playwright)
        script_errors: list[str] = []
        page = _page(browser, script_errors)
        try:
            page.goto(base + "/#/leases")
            page.fill("#username", "guest")
            page.fill("#password", "guest")
            page.click("#login")
            expect(page.locator("h1")).to_have_text("Leases", timeout=timeout_ms)
            row = page.locator(f"tr[data-queue='{queue}'][data-lease='{lease}']")
            expect(row.locator("td.lease-state")).to_have_text("holding", timeout=timeout_ms)
            expect(row.locator("td.lease-messages")).to_have_text("4")
            expect(row).to_contain_text("1..4")
            page.screenshot(path=str(ARTIFACTS / "leases.png"), full_page=True)
            row.locator("button.release-lease").click()
            expect(row.locator("td.lease-state")).to_have_text("fenced", timeout=timeout_ms)
            expect(row).to_contain_text("1..4 (released)")
            expect(row.locator("button.release-lease")).to_have_count(0)
            page.screenshot(path=str(ARTIFACTS / "lease-released.png"), full_page=True)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "failure.png"), full_page=True)
            raise
        finally:
            browser.close()
    assert script_errors == []
    row = wait_for(lambda: call(base, "GET", f"/api/queues/%2F/{queue}")[1], "the queue")
    assert row["messages_ready"] == 4
    lease_row, = call(base, "GET", f"/api/leases/%2F/{queue}")[1]
    assert (lease_row["state"], lease_row["fence"]["reason"]) == ("fenced", "released")


def test_an_operator_declares_quorum_and_classic_queues_in_the_browser(broker):
    """RabbitMQ's "Add a new queue" form on the Queues page: a quorum queue with typed
    arguments (a number and a string), then a transient classic queue (the durability
    choice is there for classic only), each listed with its type; declaring the quorum
    queue's name again as classic shows the broker's refusal (inequivalent arg); a bad number is caught
    in the page. The API holds what the form sent, under the UI's strict CSP."""
    expect, sync_playwright = _playwright()
    base = broker.management_url
    quorum, classic = f"ui-new-q-{uuid.uuid4().hex[:6]}", f"ui-new-c-{uuid.uuid4().hex[:6]}"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    timeout_ms = WAIT * 1000
    with sync_playwright() as playwright:
        browser = _browser(playwright)
        script_errors: list[str] = []
        page = _page(browser, script_errors)
        try:
            page.goto(base + "/#/queues")
            page.fill("#username", "guest")
            page.fill("#password", "guest")
            page.click("#login")
            expect(page.locator("h1")).to_have_text("Queues", timeout=timeout_ms)
            page.select_option("#new-queue-vhost", "/")
            page.select_option("#new-queue-type", "quorum")
            expect(page.locator("#new-queue-durability")).to_be_hidden()
            page.fill("#new-queue-name", quorum)
            first = page.locator("#new-queue-arguments .argument").nth(0)
            first.locator(".arg-key").fill("x-max-length")
            first.locator(".arg-value").fill("5")
            first.locator(".arg-type").select_option("number")
            page.click("#new-queue-add-argument")
            second = page.locator("#new-queue-arguments .argument").nth(1)
            second.locator(".arg-key").fill("x-overflow")
            second.locator(".arg-value").fill("reject-publish")
            page.click("#new-queue-declare")
            expect(page.locator("#new-queue-status")).to_have_text(
                f"Queue '{quorum}' declared in vhost '/'.", timeout=timeout_ms)
            row = page.locator(f"tr[data-queue='{quorum}']")
            expect(row.locator("td.type")).to_have_text("quorum", timeout=timeout_ms)
            page.screenshot(path=str(ARTIFACTS / "queue-declared.png"), full_page=True)

            page.select_option("#new-queue-type", "classic")
            expect(page.locator("#new-queue-durability")).to_be_visible()
            page.fill("#new-queue-name", classic)
            page.select_option("#new-queue-durable", "false")
            argument = page.locator("#new-queue-arguments .argument").nth(0)
            argument.locator(".arg-key").fill("x-message-ttl")
            argument.locator(".arg-value").fill("sixty")
            argument.locator(".arg-type").select_option("number")
            page.click("#new-queue-declare")
            expect(page.locator("#error")).to_have_text(
                "argument x-message-ttl: 'sixty' is not a number", timeout=timeout_ms)
            argument.locator(".arg-value").fill("60000")
            page.click("#new-queue-declare")
            expect(page.locator(f"tr[data-queue='{classic}'] td.type")).to_have_text(
                "classic", timeout=timeout_ms)
            expect(page.locator("#error")).to_be_hidden()

            # the quorum queue's name again, as a classic queue: the broker refuses
            page.fill("#new-queue-name", quorum)
            page.select_option("#new-queue-durable", "true")
            page.click("#new-queue-declare")
            expect(page.locator("#error")).to_have_text(re.compile(
                rf"^400 inequivalent arg '[a-z-]+' for queue '{quorum}' in vhost '/'"),
                timeout=timeout_ms)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "failure.png"), full_page=True)
            raise
        finally:
            browser.close()
    assert script_errors == []
    row = call(base, "GET", f"/api/queues/%2F/{quorum}")[1]
    assert (row["type"], row["durable"], row["auto_delete"]) == ("quorum", True, False)
    assert row["arguments"] == {"x-queue-type": "quorum", "x-max-length": 5,
                                "x-overflow": "reject-publish"}
    row = call(base, "GET", f"/api/queues/%2F/{classic}")[1]
    assert (row["type"], row["durable"], row["auto_delete"]) == ("classic", False, False)
    assert row["arguments"] == {"x-queue-type": "classic", "x-message-ttl": 60000}
