"""The page at ``/`` in a real headless browser (Debian's chromium driven by playwright with
``executable_path``; a browser cannot be downloaded at test time): send a query, correct the answer
in one click, ask again, and check that the page shows the corrected answer and what steered it;
an API key typed into the page reloads the memory list and lasts for the tab's session only; and
a page on another origin (a second local port, and a DNS-rebound name) cannot teach the memory."""
from __future__ import annotations

import http.server
import shutil
import threading

import pytest

pytest.importorskip("fastapi")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install \".[test]\")")

from _serve_server import API_KEY, Server, free_port  # noqa: E402

pytestmark = pytest.mark.model
CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser")) if p), None)


needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH: apt-get install -y "
                                                             "chromium (.ci/run installs it when it runs as root)")


def launch(p, *args):
    return p.chromium.launch(executable_path=CHROMIUM, headless=True,
                             args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", *args])


@needs_chromium
def test_page_correct_and_ask_again(tmp_path):
    srv = Server("--memory", f"desk={tmp_path / 'desk'}", log=tmp_path / "server.log", api_key=None)
    try:
        # a first example, so the memory exists; the query below is about something else
        st, _ = srv.request("POST", "/v1/memories/desk/examples", [{"input": "my card was charged twice",
                                                                    "output": "billing desk"}])
        assert st == 200
        q = "The courier lost my package last week."
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            page = browser.new_page()
            page.goto(srv.url + "/")
            page.wait_for_function("document.querySelectorAll('#model option').length == 2")
            assert page.input_value("#model").endswith(":desk")
            page.fill("#query", q)
            page.click("#ask")
            page.wait_for_selector(".turn")
            first = page.inner_text(".turn .answer-text").strip()
            assert first != "shipping desk"
            page.fill(".turn .correction", "shipping desk")
            page.click(".turn .teach")  # the one click: "the answer should have been ..."
            page.wait_for_function("document.getElementById('status').textContent.startsWith('taught')")
            assert "memory version 2" in page.inner_text("#status")
            page.click("#ask")  # ask again
            page.wait_for_function("document.querySelectorAll('.turn').length == 2")
            newest = page.locator(".turn").first
            assert newest.locator(".answer-text").inner_text().strip() == "shipping desk"
            why = newest.locator(".why").inner_text()
            assert "v2" in why and '"shipping desk"' in why  # the stored answer as users read it
            # the adapt switch: the frozen model does not give the taught answer
            page.uncheck("#adapt")
            page.click("#ask")
            page.wait_for_function("document.querySelectorAll('.turn').length == 3")
            assert page.locator(".turn").first.locator(".answer-text").inner_text().strip() != "shipping desk"
            assert "not adapted" in page.locator(".turn").first.locator(".why").inner_text()
            browser.close()
    finally:
        srv.stop()


@needs_chromium
def test_page_api_key_reloads_memories_for_the_session(tmp_path):
    srv = Server("--memory", f"desk={tmp_path / 'desk'}", log=tmp_path / "server.log")  # with --api-key
    try:
        with sync_api.sync_playwright() as p:
            browser = launch(p)
            page = browser.new_page()
            page.goto(srv.url + "/")
            page.wait_for_function("document.querySelector('#status .err') !== null")  # 401: no key yet
            assert "API key" in page.inner_text("#status")
            assert page.locator("#model option").count() == 0
            page.fill("#key", "wrong")
            page.wait_for_function("document.querySelector('#status .err') !== null")
            assert page.locator("#model option").count() == 0
            page.fill("#key", API_KEY)  # typing the key reloads the memory list
            page.wait_for_function("document.querySelectorAll('#model option').length == 2")
            assert page.input_value("#model").endswith(":desk")
            page.fill("#query", "hello there")
            page.click("#ask")
            page.wait_for_selector(".turn")
            page.reload()  # the key lasts for the tab's session ...
            page.wait_for_function("document.querySelectorAll('#model option').length == 2")
            assert page.input_value("#key") == API_KEY
            assert page.evaluate("localStorage.length") == 0  # ... and is never stored beyond it
            assert page.evaluate("document.cookie") == ""
            other = browser.new_context().new_page()  # a new session does not have it
            other.goto(srv.url + "/")
            other.wait_for_function("document.querySelector('#status .err') !== null")
            assert other.input_value("#key") == ""
            browser.close()
    finally:
        srv.stop()


ATTACK = """<!doctype html><html><body>
<form id="f" method="POST" enctype="text/plain" action="{target}/v1/memories/desk/examples">
<input type="hidden" name='[{{"input": "my card was charged twice", "output": "attacker desk", "x": "' value='"}}]'>
</form>
<script>
async function attack() {{
  const body = JSON.stringify([{{input: "my card was charged twice", output: "attacker desk"}}]);
  try {{ await fetch("{target}/v1/memories/desk/examples", {{method: "POST", mode: "no-cors",
        headers: {{"Content-Type": "text/plain"}}, body}}); }} catch (e) {{}}
  try {{ await fetch("{target}/v1/memories/desk/examples", {{method: "POST",
        headers: {{"Content-Type": "application/json"}}, body}}); }} catch (e) {{}}
  document.title = "fetched";
  document.getElementById("f").submit();
}}
attack();
</script></body></html>"""


class _AttackPage(http.server.BaseHTTPRequestHandler):
    html = b""

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(self.html)

    def log_message(self, *a):
        pass


@needs_chromium
def test_cross_origin_pages_cannot_teach(tmp_path):
    """A page on another local port, and one on a DNS-rebound name, try to teach: a no-cors
    text/plain fetch, a JSON fetch (preflighted), and a form POST. The memory's version stays."""
    srv = Server("--memory", f"desk={tmp_path / 'desk'}", log=tmp_path / "server.log", api_key=None)
    httpd = None
    try:
        st, rep = srv.request("POST", "/v1/memories/desk/examples", [{"input": "my card was charged twice",
                                                                      "output": "billing desk"}])
        assert st == 200 and rep["version"] == 1
        _AttackPage.html = ATTACK.format(target=srv.url).encode()
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _AttackPage)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        evil_port = httpd.server_address[1]
        with sync_api.sync_playwright() as p:
            browser = launch(p, "--host-resolver-rules=MAP evil.test 127.0.0.1")
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{evil_port}/")  # another origin: a second local port
            page.wait_for_url(f"{srv.url}/v1/memories/desk/examples", timeout=30000)  # the form was posted
            assert "origin_not_allowed" in page.content()
            # DNS rebinding: the attacker's name now resolves to 127.0.0.1, and its page (served here by
            # playwright's routing, as the attacker's server would have) calls "its own" origin
            rebound = f"http://evil.test:{srv.port}"
            page.route(rebound + "/", lambda route: route.fulfill(
                status=200, content_type="text/html", body=ATTACK.format(target=rebound)))
            page.goto(rebound + "/")
            page.wait_for_url(rebound + "/v1/memories/desk/examples", timeout=30000)
            assert "host_not_allowed" in page.content()
            browser.close()
        st, info = srv.get("/v1/memories/desk")
        assert st == 200 and info["version"] == 1 and info["examples"] == 1
    finally:
        if httpd is not None:
            httpd.shutdown()
        srv.stop()
