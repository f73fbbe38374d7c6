"""The page at ``/`` in a real headless browser (Debian's chromium driven by playwright with
``executable_path``; a browser cannot be downloaded at test time): send a query, correct the answer
in one click, ask again, and check that the page shows the corrected answer and what steered it."""
from __future__ import annotations

import shutil

import pytest

pytest.importorskip("fastapi")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install \".[test]\")")

from _serve_server import Server  # noqa: E402

pytestmark = pytest.mark.model
CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser")) if p), None)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH: apt-get install -y chromium "
                                             "(.ci/run installs it when it runs as root)")
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
            assert "v2" in why and '" shipping desk"' in why
            # the adapt switch: the frozen model does not give the taught answer
            page.uncheck("#adapt")
            page.click("#ask")
            page.wait_for_function("document.querySelectorAll('.turn').length == 3")
            assert page.locator(".turn").first.locator(".answer-text").inner_text().strip() != "shipping desk"
            assert "not adapted" in page.locator(".turn").first.locator(".why").inner_text()
            browser.close()
    finally:
        srv.stop()
