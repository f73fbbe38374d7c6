"""Check the Open WebUI functions in a real Open WebUI, through its web page.

Needs a running ``miita-edge serve`` with an API key and one memory, a running Open WebUI whose
OpenAI connection points at it (docs/serving.md, "Set-up (offline)"; ``WEBUI_AUTH=False``), and
playwright with a Chromium (``pip install playwright``; Debian: ``apt-get install chromium``).
It installs (or updates) both functions through Open WebUI's API, switches them on for every
model, sets their Valves, then drives the page as a user would:

1. a new chat asks QUESTION; 2. the answer is edited to CORRECTION and saved, and ``thanks!`` is
sent: the memory's version must move by one, and only then, and the "Taught" line must still be
on the page after a reload; the chat's title must be the server's (made from the first message,
TITLE), not Open WebUI's fallback; 3. "Continue Response" on the last answer, then another
message: nothing taught (the doubled text is the model's); 4. a new chat asks PARAPHRASE, a question
in other words than the one taught, and one asks QUESTION again: both answers must be CORRECTION
(one taught example reaches as far as the model's own paraphrases); 5. "Wrong answer" on it, a second correction typed in the dialog: the
version must move by one more; 6. "Teach this answer" on it: already taught, the version must not
move; 7. "Forget", entry 1 picked: the version must move; 8. a new chat asks LONG_QUESTION, its
answer is edited to LONG (multi-line, about 40 tokens) and taught by the next message; asked again
in that chat and then as a new chat's first question, it must show every line of LONG (a request
without max_tokens is not cut), and the new chat's first text must come no more than a second
after the same question's later in a chat (the title request Open WebUI sends just before a new
chat's first question must not hold it up). Each step waits for the answer's last
status line (the Filter's outlet: the answer is complete) before its screenshot and check.
Screenshots go to ``--shots``. Exit status 0 when every check passes.

    python integrations/open_webui/e2e.py --server http://127.0.0.1:8080 --api-key KEY \\
        --webui http://127.0.0.1:3000 --memory support --shots /tmp/owui-shots
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUESTION = "my parcel never arrived"
PARAPHRASE = "the parcel I ordered never arrived"  # steered by the one correction (embedded Gemma, default preset)
CORRECTION = "Sorry about that! Please write to the shipping desk: shipping@example.com."
SECOND = "Please contact the shipping desk; a lost parcel is refunded after 14 days."
LONG_QUESTION = "what do I need to open an account"
LONG = ("You need:\n- a passport or an identity card with a photo\n- a proof of address from the last three months\n"
        "- a phone number where we can reach you\nThe account opens the same day, and the card follows by post.")
TITLE = "My parcel never arrived"  # the server's title rule (serve/task_reply.py) on QUESTION
STATUS = "text=/(Not s|S)teered by memory/"  # the Filter's outlet line: the answer is complete


def http(url: str, body=None, token: str | None = None) -> dict | list | None:
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {token}"} if token else {})})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read() or b"null")


def install_functions(webui: str, token: str, server: str, key: str) -> None:
    """Create or update both functions, switch them on and Global, and set their Valves."""
    have = {f["id"]: f for f in http(f"{webui}/api/v1/functions/", token=token)}
    for fid, desc in (("miita_feedback", "teaches edited answers"), ("miita_teach", "teach buttons")):
        form = {"id": fid, "name": fid, "content": (HERE / f"{fid}.py").read_text("utf-8"),
                "meta": {"description": desc}}
        if fid in have:
            http(f"{webui}/api/v1/functions/id/{fid}/update", form, token)
        else:
            http(f"{webui}/api/v1/functions/create", form, token)
        f = http(f"{webui}/api/v1/functions/id/{fid}", token=token)
        if not f["is_active"]:
            http(f"{webui}/api/v1/functions/id/{fid}/toggle", {}, token)
        if not f["is_global"]:
            http(f"{webui}/api/v1/functions/id/{fid}/toggle/global", {}, token)
        http(f"{webui}/api/v1/functions/id/{fid}/valves/update",
             {"base_url": server, "api_key": key, "memory": ""}, token)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default="http://127.0.0.1:8080", help="miita-edge serve, as Open WebUI reaches it")
    ap.add_argument("--api-key", required=True, help="the server's --api-key")
    ap.add_argument("--webui", default="http://127.0.0.1:3000", help="Open WebUI's address")
    ap.add_argument("--memory", default="support", help="the served memory to chat with (new and empty)")
    ap.add_argument("--shots", type=Path, default=Path("open-webui-shots"), help="where screenshots go")
    ap.add_argument("--chromium", default="/usr/bin/chromium", help="the browser binary")
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright  # optional: only this check needs it

    args.shots.mkdir(parents=True, exist_ok=True)
    token = http(f"{args.webui}/api/v1/auths/signin", {"email": "", "password": ""})["token"]
    install_functions(args.webui, token, args.server, args.api_key)
    models = [m["id"] for m in http(f"{args.webui}/api/models", token=token)["data"]]
    model = next((m for m in models if m.endswith(f":{args.memory}")), None)
    if model is None:
        print(f"Open WebUI lists no model for memory {args.memory!r}: {models}", file=sys.stderr)
        return 2

    def memory_info() -> dict:
        req = urllib.request.Request(f"{args.server}/v1/memories/{args.memory}",
                                     headers={"Authorization": f"Bearer {args.api_key}"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def version() -> int:
        return memory_info()["version"]

    checks: list[tuple[str, bool, str]] = []

    def check(name: str, ok: bool, detail: str = "") -> None:
        checks.append((name, ok, detail))
        print(f"{'PASS' if ok else 'FAIL'}  {name}{': ' + detail if detail else ''}", flush=True)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 860})

        def new_chat() -> None:
            page.goto(f"{args.webui}/?model={model}", wait_until="load", timeout=120_000)
            page.wait_for_selector("#chat-input", timeout=60_000)
            ok = page.locator("button:has-text(\"Okay, Let's Go!\")")
            if ok.count():
                ok.click()
                time.sleep(1)

        def settle(n_done: int) -> None:
            """Wait until ``n_done`` answers of this chat show the Filter's last status line (its
            outlet ran: the answer is complete), then until the page stops changing."""
            t0 = time.time()
            while time.time() - t0 < 300:
                if page.locator(STATUS).count() >= n_done:
                    break
                time.sleep(1)
            else:
                raise TimeoutError(f"{n_done} answers did not complete within 300 s")
            last = None
            for _ in range(30):
                now = page.locator("#response-content-container").all_inner_texts()
                if now == last:
                    return
                last = now
                time.sleep(1)

        def first_text_after(text: str, n_answers: int) -> tuple[float, str]:
            """Send ``text``; the seconds until the ``n_answers``-th answer shows its first text (what
            a user waits for) and that text; then wait for the answer to complete."""
            box = page.locator("#chat-input")
            box.click()
            box.fill(text)
            t0 = time.perf_counter()
            page.keyboard.press("Enter")
            seen = ""
            while time.perf_counter() - t0 < 300:
                shown = page.locator("#response-content-container")
                if shown.count() >= n_answers:
                    seen = shown.nth(n_answers - 1).inner_text().strip()
                    if seen:
                        break
                time.sleep(0.05)
            waited = time.perf_counter() - t0
            settle(n_answers)
            return waited, seen

        def send(text: str, n_answers: int) -> str:
            """Send ``text``; the ``n_answers``-th answer's text once it is complete."""
            first_text_after(text, n_answers)
            return page.locator("#response-content-container").nth(n_answers - 1).inner_text()

        def click_under_answer(button: str) -> None:
            page.locator(f"button[aria-label='{button}']:visible").last.click()
            time.sleep(1.5)

        def type_into(button: str, field: str, text: str, shot: str, done: str) -> None:
            """Click the last visible button labelled ``button`` under an answer, type ``text`` into
            the field it opens, take ``shot``, and press ``done``."""
            click_under_answer(button)
            page.locator(field).last.fill(text)
            page.screenshot(path=str(args.shots / shot))
            page.locator(done).last.click()
            time.sleep(4)  # the Action's call to the server and its status line

        def chat_titles() -> list[str]:
            return [c.get("title") for c in http(f"{args.webui}/api/v1/chats/", token=token) or []]

        v0 = version()
        if v0 != 0:
            print(f"memory {args.memory!r} is at version {v0}: the check needs a new, empty memory", file=sys.stderr)
            return 2
        new_chat()
        first = send(QUESTION, 1)
        page.screenshot(path=str(args.shots / "01-first-answer.png"))
        check("a plain chat teaches nothing", version() == v0, f"answer {first!r}")
        type_into("Edit", "textarea", CORRECTION, "02-editing.png", "button:text-is('Save'):visible")
        check("saving an edit teaches nothing yet", version() == v0)
        send("thanks!", 2)
        page.screenshot(path=str(args.shots / "03-taught-on-next-message.png"))
        check("the next message teaches the edit", version() == v0 + 1, f"version {version()}")
        page.reload(wait_until="load")
        page.wait_for_selector("#chat-input", timeout=60_000)
        settle(2)
        check("the Taught line stays on the page", page.locator("text=/Taught memory/").count() >= 1)
        titles = chat_titles()
        check("the chat's title is the server's, not Open WebUI's fallback", TITLE in titles, repr(titles[:3]))

        click_under_answer("Continue Response")
        settle(2)
        send("ok", 3)
        page.screenshot(path=str(args.shots / "04-continued-not-taught.png"))
        check("a continued answer is not taught", version() == v0 + 1, f"version {version()}")

        new_chat()
        para = send(PARAPHRASE, 1)
        page.screenshot(path=str(args.shots / "05-paraphrase-corrected.png"))
        check("a paraphrase in a new chat is answered with the one correction", para.startswith(CORRECTION),
              repr(para))
        new_chat()
        again = send(QUESTION, 1)
        page.screenshot(path=str(args.shots / "06-new-chat-corrected.png"))
        check("the same question is answered with the correction", again.startswith(CORRECTION), repr(again))
        check("asking teaches nothing", version() == v0 + 1)
        type_into("Wrong answer", "input:visible, textarea:visible", SECOND, "07-wrong-answer-dialog.png",
                  "button:has-text('Confirm'):visible")
        page.screenshot(path=str(args.shots / "07b-taught-by-action.png"))
        check("the Wrong answer dialog teaches", version() == v0 + 2, f"version {version()}")
        click_under_answer("Teach this answer")
        time.sleep(4)
        check("an example already taught is not taught again", version() == v0 + 2, f"version {version()}")
        examples = memory_info()["examples"]
        type_into("Forget", "input:visible, textarea:visible", "1", "08-forget-dialog.png",
                  "button:has-text('Confirm'):visible")
        page.screenshot(path=str(args.shots / "09-forgotten.png"))
        info = memory_info()
        check("Forget removes the picked answer", info["version"] == v0 + 3 and info["examples"] < examples,
              f"version {info['version']}, examples {examples} -> {info['examples']}")

        # a long, multi-line correction comes back whole (Open WebUI sends no max_tokens), and a new
        # chat's first answer is not held up by the title request Open WebUI sends just before it
        new_chat()
        send(LONG_QUESTION, 1)
        type_into("Edit", "textarea", LONG, "10-long-edit.png", "button:text-is('Save'):visible")
        send("thanks!", 2)
        check("a long multi-line edit is taught", version() == v0 + 4, f"version {version()}")
        later_wait, _ = first_text_after(LONG_QUESTION, 3)  # the same question later in a chat
        new_chat()
        first_wait, seen = first_text_after(LONG_QUESTION, 1)  # and as a new chat's first question
        whole = page.locator("#response-content-container").nth(0).inner_text()
        page.screenshot(path=str(args.shots / "11-long-answer.png"))
        lines = [ln.removeprefix("- ") for ln in LONG.splitlines()]
        check("the long multi-line correction comes back whole", all(ln in whole for ln in lines), repr(whole))
        check("a new chat's first answer waits no longer than the same question later in a chat (+1 s)",
              first_wait <= later_wait + 1.0, f"first text after {first_wait:.2f} s ({seen[:30]!r}), "
              f"later in a chat {later_wait:.2f} s")
        browser.close()
    failed = [c for c in checks if not c[1]]
    print(f"{len(checks) - len(failed)}/{len(checks)} checks passed; screenshots in {args.shots}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
