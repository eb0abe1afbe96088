"""A page of another origin cannot act through a browser logged in to the management
API (issue 30, "CSRF"): headless Chromium (Debian's, through Playwright, as
test_web_ui.py) first opens an /api URL of the node and answers its basic-auth
challenge, so it holds the credentials as a logged-in operator's browser does; then
it opens pages served from another port (another origin) whose script tries to
create an administrator every way a page can without the API's consent: forms posted as
text/plain (whose field makes a JSON body), urlencoded and multipart, a no-cors
fetch with a body and no Content-Type, a CORS fetch of JSON (preflighted), and the
UI in a frame. Before the fix the text/plain form created the user (the API took
any body as JSON); now each is a 415, a preflight the browser refuses, or a frame
the browser does not draw (X-Frame-Options DENY, frame-ancestors 'none').
"""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess, free_port

from .support import WAIT, call, wait_until_serving

pytestmark = pytest.mark.timeout(180)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def _user(name: str) -> str:
    return json.dumps({"users": [{"name": name, "password": "pw", "tags": "administrator"}],
                       "vhosts": [], "permissions": []})


def attack_pages(api: str) -> dict[str, str]:
    """path -> HTML of the attacker's pages; each one's attack() tries to create the
    user `csrf-<path>` (or, "frame", to draw the UI in a frame of its own)."""
    definitions = f"{api}/api/definitions"
    text_plain_field = _user("csrf-text-plain")[:-1] + ', "pad": "'
    return {
        "text-plain": f"""<form id=f method=POST enctype="text/plain" action="{definitions}">
            <input type=hidden name='{text_plain_field}' value='"}}'></form>
            <script>function attack() {{ document.getElementById("f").submit() }}</script>""",
        "urlencoded": f"""<form id=f method=POST action="{definitions}">
            <input type=hidden name=users value='{_user("csrf-urlencoded")}'></form>
            <script>function attack() {{ document.getElementById("f").submit() }}</script>""",
        "multipart": f"""<form id=f method=POST enctype="multipart/form-data"
            action="{definitions}"><input type=hidden name=file
            value='{_user("csrf-multipart")}'></form>
            <script>function attack() {{ document.getElementById("f").submit() }}</script>""",
        "fetch-no-cors": f"""<script>function attack() {{
            fetch("{definitions}", {{method: "POST", mode: "no-cors", credentials: "include",
              body: new Blob([{json.dumps(_user("csrf-fetch-no-cors"))}])}})
              .then(() => document.title = "sent", () => document.title = "refused");
            }}</script>""",
        "fetch-cors-json": f"""<script>function attack() {{
            fetch("{api}/api/users/csrf-fetch-cors-json", {{method: "PUT",
              credentials: "include", headers: {{"Content-Type": "application/json"}},
              body: JSON.stringify({{password: "pw", tags: "administrator"}})}})
              .then(() => document.title = "sent", () => document.title = "refused");
            }}</script>""",
        "frame": f"""<script>function attack() {{
            const frame = document.createElement("iframe");
            frame.id = "ui"; frame.src = "{api}/"; frame.width = 800; frame.height = 600;
            document.body.append(frame);
            }}</script>""",
    }


@pytest.fixture
def foreign_origin(broker):
    pages = attack_pages(broker.management_url)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = pages.get(self.path.strip("/"), "").encode()
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", pages
    server.shutdown()
    server.server_close()
    thread.join(WAIT)


@pytest.fixture
def broker():
    with BrokerProcess() as process:
        wait_until_serving(process.management_url)
        yield process


def attack(page, name: str, api: str) -> list:
    """Run the page's attack(); what the API answered (or the browser saw)."""
    if name == "fetch-cors-json":
        page.evaluate("attack()")
        page.wait_for_function("document.title !== ''")
        return [page.title()]
    with page.expect_response(lambda response: response.url.startswith(api)) as response:
        page.evaluate("attack()")
    answer = [response.value.status]
    page.wait_for_load_state("networkidle")
    if name == "frame":
        # a framed UI would draw its login form; a refused frame draws nothing
        answer.append(page.frame_locator("#ui").locator("#login").count())
    return answer


def test_a_page_of_another_origin_cannot_create_a_user(broker, foreign_origin):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright is not installed (pip install -e '.[dev]'): the CSRF "
                    "browser test did NOT run")
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (.ci/install-chromium needs root "
                    "and apt-get): the CSRF browser test did NOT run")
    origin, pages = foreign_origin
    api = broker.management_url
    answers: dict[str, list] = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=["--no-sandbox"])
        try:
            for name in pages:
                # a browser of its own per attack: it answered the API's challenge and
                # holds the login, as an operator's browser that opened an /api URL
                context = browser.new_context(http_credentials={"username": "guest",
                                                                "password": "guest"})
                try:
                    page = context.new_page()
                    page.set_default_timeout(WAIT * 1000)
                    assert page.goto(api + "/api/whoami").status == 200
                    page.goto(f"{origin}/{name}")
                    answers[name] = attack(page, name, api)
                finally:
                    context.close()
        finally:
            browser.close()
    created = [name for name in pages if name != "frame"
               and call(api, "GET", f"/api/users/csrf-{name}")[0] == 200]
    assert created == [], f"created through another origin: {created}; answers {answers}"
    for name in ("text-plain", "urlencoded", "multipart", "fetch-no-cors"):
        assert answers[name] == [415], answers
    # the preflight was answered without Access-Control-Allow-Origin: the browser
    # refused the fetch and never sent the PUT
    assert answers["fetch-cors-json"] == ["refused"], answers
    # the UI was served (200) but not drawn in the other origin's frame
    assert answers["frame"] == [200, 0], answers
