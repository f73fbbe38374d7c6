"""The Open WebUI functions shipped in integrations/open_webui/ (the Filter miita_feedback.py, the
Action miita_teach.py), driven the way Open WebUI drives them -- inlet, the server's streamed
chunks through ``stream``, outlet, actions; payloads shaped from its source
(tests/data/open_webui/FUNCTIONS.md) -- against a real ``miita-edge serve`` on a tiny GGUF, with
no Open WebUI installed. Checked on the memory itself: an edited answer teaches (version and
example count move, the next identical question is answered with the correction), a plain chat
and background tasks teach nothing, a failed teach is reported and retried."""
from __future__ import annotations

import ast
import asyncio
import copy
import json
import re
import sys
import types
import urllib.request
import uuid
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("pydantic")

from _serve_server import API_KEY, Server, tiny_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FUNCTIONS = ROOT / "integrations" / "open_webui"
DATA = Path(__file__).parent / "data" / "open_webui"
MEMORIES = ("plain", "edit", "outlet", "tasks", "action", "fail", "support")  # support: the recording's
# the tiny model answers these with something else until taught; "billing" is one token for it,
# so a steered answer reproduces it whole (longer corrections drift after a few tokens)
QUESTION, CORRECTION = "Can I get a refund?", "billing"


def load_function(name: str) -> types.ModuleType:
    """Exec the file in a fresh module, as Open WebUI's ``load_function_module_by_id`` does."""
    module = types.ModuleType(f"function_{name}")
    sys.modules[module.__name__] = module  # dataclasses look their module up while the class is made
    module.__dict__["__file__"] = str(FUNCTIONS / f"{name}.py")
    exec((FUNCTIONS / f"{name}.py").read_text("utf-8"), module.__dict__)
    return module


def frontmatter(text: str) -> dict:
    """Open WebUI's ``extract_frontmatter``: `key: value` lines of a docstring on the first line."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != '"""':
        return {}
    out = {}
    for line in lines[1:]:
        if '"""' in line:
            break
        m = re.match(r"^\s*([a-z_]+):\s*(.*)\s*$", line, re.IGNORECASE)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def template(name: str) -> dict:
    return json.loads((DATA / name).read_text("utf-8"))


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    d = tmp_path_factory.mktemp("owui")
    args = [a for n in MEMORIES for a in ("--memory", f"{n}={d / 'mem' / n}")]
    s = Server("--model", str(tiny_model(d)), *args, log=d / "server.log")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def model_id(srv):
    return srv.get("/v1/models")[1]["data"][0]["id"]


def memory(srv, name: str) -> dict:
    st, info = srv.get(f"/v1/memories/{name}")
    assert st == 200, info
    return info


def make_filter(srv, **valves):
    f = load_function("miita_feedback").Filter()
    f.valves = f.Valves(base_url=srv.url, api_key=API_KEY, **valves)
    return f


class Chat:
    """One Open WebUI chat with the Filter on: what the browser and Open WebUI's middleware do."""

    def __init__(self, srv, flt, model: str):
        self.srv, self.flt, self.model = srv, flt, model
        self.chat_id, self.session_id = str(uuid.uuid4()), "sess-" + uuid.uuid4().hex[:8]
        self.history: list[dict] = []  # the chat as Open WebUI stores it (ids)
        self.events: list[tuple[str, dict]] = []  # (hook, event) for every event a hook emitted

    def emitter(self, hook: str):
        async def emit(event: dict):
            self.events.append((hook, event))
        return emit

    def send(self, question: str, inlet: bool = True) -> dict:
        """The user sends `question`: inlet -> the server (streamed) through `stream` -> outlet."""
        answer_id = str(uuid.uuid4())
        self.history.append({"id": str(uuid.uuid4()), "role": "user", "content": question, "timestamp": 1})
        t = template("inlet.json")
        body = t["body"] | {"model": self.model, "chat_id": self.chat_id, "id": answer_id,
                            "session_id": self.session_id,
                            "messages": [{"role": m["role"], "content": m["content"]} for m in self.history]}
        md = t["metadata"] | {"chat_id": self.chat_id, "message_id": answer_id, "session_id": self.session_id}
        if inlet:
            body = asyncio.run(self.flt.inlet(body, __user__=t["user"], __metadata__=md,
                                              __event_emitter__=self.emitter("inlet")))
        text, miita = self.complete(body["messages"], md)
        message = template("outlet.json")["message"] | {"id": answer_id, "content": text}
        self.history.append(message)
        out = template("outlet.json")["body"] | {"model": self.model, "chat_id": self.chat_id, "id": answer_id,
                                                  "session_id": self.session_id,
                                                  "messages": copy.deepcopy(self.history)}
        seen = len(self.events)
        asyncio.run(self.flt.outlet(out, __user__=t["user"], __metadata__=md, __event_emitter__=self.emitter("outlet")))
        sources = [e["data"] for _, e in self.events[seen:] if e["type"] == "source"]
        if sources:  # Open WebUI appends a source event's data to the message's sources
            message["sources"] = sources
        return {"id": answer_id, "content": text, "miita": miita}

    def complete(self, messages: list[dict], md: dict) -> tuple[str, dict]:
        """Open WebUI's OpenAI connection: a streamed chat completion; each parsed `data:` line
        goes through the Filter's `stream` hook, as in its middleware."""
        req = urllib.request.Request(self.srv.url + "/v1/chat/completions", method="POST",
                                     data=json.dumps({"model": self.model, "messages": messages,
                                                      "stream": True}).encode(),
                                     headers={"Content-Type": "application/json", **self.srv.headers()})
        text, miita = [], None
        with urllib.request.urlopen(req, timeout=120) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                event = self.flt.stream(json.loads(line[5:].strip()), __metadata__=md)
                for ch in event.get("choices") or []:
                    text.append((ch.get("delta") or {}).get("content") or "")
                miita = event.get("miita") or miita
        assert miita is not None, "the server's last chunk carries the miita object"
        return "".join(text), miita

    def edit(self, message_id: str, text: str) -> None:
        """The user edits an answer in place (Open WebUI saves the chat; no function runs)."""
        next(m for m in self.history if m["id"] == message_id)["content"] = text

    def statuses(self, hook: str | None = None) -> list[str]:
        return [e["data"]["description"] for h, e in self.events if e["type"] == "status" and hook in (None, h)]


# ---------------------------------------------------------------------------------------- the files


@pytest.mark.parametrize("name,cls,other", [("miita_feedback", "Filter", ("Pipe",)),
                                            ("miita_teach", "Action", ("Pipe", "Filter"))])
def test_files_load_as_open_webui_functions(name, cls, other):
    """Open WebUI reads the metadata docstring and picks the function type by the class present
    (Pipe, then Filter, then Action); the file imports with the standard library and pydantic only."""
    text = (FUNCTIONS / f"{name}.py").read_text("utf-8")
    meta = frontmatter(text)
    assert {"title", "version", "description", "license"} <= set(meta), meta
    module = load_function(name)
    assert hasattr(module, cls) and not any(hasattr(module, o) for o in other)
    obj = getattr(module, cls)()
    assert obj.valves.base_url.startswith("http://127.0.0.1")
    imported = {(n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
                for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in (n.names if isinstance(n, ast.Import) else [n])}
    assert imported - set(sys.stdlib_module_names) <= {"pydantic"}, imported


# ---------------------------------------------------------------------------------------- the Filter


def test_plain_chat_teaches_nothing_and_shows_why(srv, model_id):
    flt = make_filter(srv)
    chat = Chat(srv, flt, f"{model_id}:plain")
    for q in (QUESTION, "And how long does it take?", QUESTION):
        chat.send(q)
    assert memory(srv, "plain")["version"] == 0 and not flt.reports
    assert all(s == "Not steered by memory plain v0: the memory is empty" for s in chat.statuses())
    assert len(chat.statuses("outlet")) == 3 and not chat.statuses("inlet")


def test_edited_answer_teaches_once_and_is_the_next_answer(srv, model_id):
    flt = make_filter(srv)
    chat = Chat(srv, flt, f"{model_id}:edit")
    first = chat.send(QUESTION)
    assert first["content"].strip() != CORRECTION, "the tiny model already answers the correction"
    assert memory(srv, "edit")["version"] == 0
    chat.edit(first["id"], f" {CORRECTION}\n")
    chat.send("Thanks. Anything else?")  # the edit is seen in this request's inlet (messages without ids)
    info = memory(srv, "edit")
    assert info["version"] == 1 and info["examples"] == 1, info
    assert [r["version"] for r in flt.reports] == [1]
    taught = [s for s in chat.statuses("inlet") if s.startswith("Taught")]
    assert taught == [f"Taught memory edit (version 1): \u201c{QUESTION}\u201d \u2192 \u201c{CORRECTION}\u201d"]
    again = chat.send(QUESTION)
    assert again["content"].strip() == CORRECTION, again
    assert again["miita"]["adapted"] and again["miita"]["steered_by"][0]["answer"].strip() == CORRECTION
    top = again["miita"]["steered_by"][0]
    assert chat.statuses("outlet")[-1].startswith(
        f"Steered by memory edit v1: \u201c{CORRECTION}\u201d (weight {top['weight']:.2f}, 1 example)")
    sources = [e for h, e in chat.events if e["type"] == "source"]
    assert len(sources) == 1 and CORRECTION in sources[0]["data"]["document"][0]
    chat.send("One more question?")  # the edited answer is still in the history: not taught again
    assert memory(srv, "edit")["version"] == 1 and len(flt.reports) == 1


def test_edit_seen_by_outlet_by_message_id(srv, model_id):
    """Without inlet (the edit only in the stored messages, with ids), outlet teaches it."""
    flt = make_filter(srv)
    chat = Chat(srv, flt, f"{model_id}:outlet")
    first = chat.send(QUESTION, inlet=False)
    chat.edit(first["id"], CORRECTION)
    assert memory(srv, "outlet")["version"] == 0
    chat.send("Thanks.", inlet=False)
    info = memory(srv, "outlet")
    assert info["version"] == 1 and info["examples"] == 1
    assert [s for s in chat.statuses("outlet") if s.startswith("Taught")]


def test_background_tasks_teach_nothing(srv, model_id):
    """Title and tags requests (tests/data/open_webui/) quote the chat, corrected answer included:
    through inlet, the server and outlet, marked as tasks or not, they teach and record nothing;
    the user's own next message then teaches the edit (so the check can fail)."""
    flt = make_filter(srv)
    chat = Chat(srv, flt, f"{model_id}:tasks")
    first = chat.send(QUESTION)
    chat.edit(first["id"], CORRECTION)
    recorded = dict(flt.answers)
    for name, task in [("title.json", "title_generation"), ("tags.json", "tags_generation")]:
        for md_task in (task, None):
            body = template(name) | {"model": f"{model_id}:tasks"}
            task_id = str(uuid.uuid4())
            md = {"chat_id": chat.chat_id, "message_id": task_id, "session_id": chat.session_id,
                  **({"task": md_task} if md_task else {})}
            out = asyncio.run(flt.inlet(body, __metadata__=md, __event_emitter__=chat.emitter("task")))
            assert out is body
            _, miita = chat.complete(body["messages"], md)
            assert miita["reason"] == "background_task"
            stored = body["messages"] + [{"id": task_id, "role": "assistant", "content": "x"}]
            asyncio.run(flt.outlet({"model": body["model"], "messages": stored, "chat_id": chat.chat_id,
                                    "id": task_id}, __metadata__=md, __event_emitter__=chat.emitter("task")))
    assert memory(srv, "tasks")["version"] == 0 and not flt.reports
    assert flt.answers == recorded and not [e for h, e in chat.events if h == "task"]
    chat.send("Thanks.")
    assert memory(srv, "tasks")["version"] == 1


def test_failed_teach_is_reported_and_retried(srv, model_id):
    flt = make_filter(srv)
    flt.valves = flt.Valves(base_url=srv.url, api_key="wrong-key")
    chat = Chat(srv, flt, f"{model_id}:fail")
    first = chat.send(QUESTION)
    chat.edit(first["id"], CORRECTION)
    chat.send("Thanks.")  # inlet must not raise: the chat goes on
    assert memory(srv, "fail")["version"] == 0
    assert any(s.startswith("Could not teach memory fail: HTTP 401") for s in chat.statuses("inlet"))
    flt.valves = flt.Valves(base_url=srv.url, api_key=API_KEY)
    chat.send("Still there?")
    assert memory(srv, "fail")["version"] == 1


def test_edit_matching_without_ids():
    """The inlet's messages have no ids: an answer is matched by chat, turn (answers with text;
    the browser drops empty ones) and question. A regeneration's text, another chat's answer or a
    changed question is not an edit; a changed text is. No server: nothing is taught here."""
    flt = load_function("miita_feedback").Filter()
    q1, q2 = "first question", "second question"

    def outlet(chat_id, history, answer_id):
        asyncio.run(flt.outlet({"model": "m:mem", "chat_id": chat_id, "id": answer_id, "messages": history}))

    base = [{"id": "u1", "role": "user", "content": q1}, {"id": "a1", "role": "assistant", "content": "one"}]
    outlet("c", base, "a1")
    outlet("c", base[:1] + [{"id": "a1b", "role": "assistant", "content": "uno"}], "a1b")  # regenerated
    later = base + [{"id": "u2", "role": "user", "content": q2}, {"id": "a2", "role": "assistant", "content": ""},
                    {"id": "u3", "role": "user", "content": q2}, {"id": "a3", "role": "assistant", "content": "two"}]
    outlet("c", later, "a3")
    assert flt.answers["a3"].turn == 1 and flt.answers["a1b"].turn == 0

    def inlet_view(texts, questions=(q1, q2)):  # what the browser sends: {role, content}, empty answers left out
        out = []
        for i, (q, t) in enumerate(zip(questions, texts)):
            out += [{"role": "user", "content": q}] * (1 + i) + [{"role": "assistant", "content": t}]
        return out + [{"role": "user", "content": "next"}]

    def edited(messages, chat="c"):
        return [(rec.message_id, text) for rec, text in flt.edits(messages, chat)]

    assert edited(inlet_view(["one", "two"])) == [] and edited(inlet_view([" uno\n", "two"])) == []
    assert edited(inlet_view(["fixed", "two"])) == [("a1b", "fixed")]
    assert edited(inlet_view(["one", "better two"])) == [("a3", "better two")]
    assert edited(inlet_view(["fixed", "two"]), chat="other") == []
    assert edited(inlet_view(["fixed", "two"], questions=("changed question", q2))) == []


# ---------------------------------------------------------------------------------------- the Action


def run_action(srv, chat: Chat, message_id: str, sub: str, typed=None) -> tuple[int, list[dict], list[dict]]:
    """Click an Action button on a message; (the memory's version after it, emitted events, dialogs)."""
    act = load_function("miita_teach").Action()
    act.valves = act.Valves(base_url=srv.url, api_key=API_KEY)
    upto = next(i for i, m in enumerate(chat.history) if m["id"] == message_id)
    body = template("action.json")["body"] | {"model": chat.model, "chat_id": chat.chat_id, "id": message_id,
                                              "session_id": chat.session_id,
                                              "messages": copy.deepcopy(chat.history[:upto + 1])}
    emitted, asked = [], []

    async def emit(e):
        emitted.append(e)

    async def call(e):
        asked.append(e)
        return typed

    out = asyncio.run(act.action(body, __user__=template("inlet.json")["user"], __event_emitter__=emit,
                                 __event_call__=call, __id__=sub))
    assert out is None  # a returned dict's `messages` would be merged into the chat by the browser
    return memory(srv, chat.model.rsplit(":", 1)[1])["version"], emitted, asked


def test_action_wrong_answer_asks_and_teaches(srv, model_id):
    chat = Chat(srv, make_filter(srv, teach_edits=False), f"{model_id}:action")
    first = chat.send(QUESTION)
    assert first["content"].strip() != CORRECTION
    version, emitted, asked = run_action(srv, chat, first["id"], "wrong", typed=None)  # the dialog cancelled
    assert version == 0 and emitted[-1]["data"]["description"] == "Nothing taught: no answer given"
    assert asked[0]["type"] == "input" and QUESTION in asked[0]["data"]["message"]
    assert "steered by" not in asked[0]["data"]["message"]  # the empty memory steered nothing
    version, emitted, asked = run_action(srv, chat, first["id"], "wrong", typed=f"  {CORRECTION} ")
    assert version == 1 and memory(srv, "action")["examples"] == 1
    assert emitted[-1]["data"]["description"].startswith("Taught memory action (version 1)")
    again = chat.send(QUESTION)
    assert again["content"].strip() == CORRECTION and again["miita"]["steered_by"][0]["answer"].strip() == CORRECTION
    # a steered answer: the dialog names the taught answer that steered it (from the stored source)
    version, emitted, asked = run_action(srv, chat, again["id"], "wrong", typed="")
    assert version == 1 and f"steered by the taught answer(s) \u201c{CORRECTION}\u201d" in asked[0]["data"]["message"]
    second = chat.send("Where is my parcel?")  # edited, then taught with the button at once
    chat.edit(second["id"], "shipping desk")
    version, emitted, asked = run_action(srv, chat, second["id"], "teach")
    assert not asked and version == 2 and memory(srv, "action")["examples"] == 2


# ------------------------------------------------------------------------- a recorded real Open WebUI run


def test_a_recorded_open_webui_run_replays(srv):
    """The hook calls a real Open WebUI 0.12.4 made (tests/data/open_webui/recorded/hooks.json,
    README.md there): a question the empty memory could not answer, the answer edited in the
    browser, the next message; then, in a new chat, the steered answer and the "Wrong answer"
    button. Replayed in order into fresh functions whose base_url is this test's server (which
    serves a memory named as in the recording): the edit is taught exactly when the recorded second
    inlet arrives, with the recorded texts, and the button teaches what the dialog returns."""
    steps = json.loads((DATA / "recorded" / "hooks.json").read_text("utf-8"))["steps"]
    user = template("inlet.json")["user"]
    flt = make_filter(srv)
    emitted: list[tuple[int, dict]] = []
    versions = []
    question = steps[0]["body"]["messages"][-1]["content"]
    edited = steps[4]["body"]["messages"][1]["content"]  # the second inlet carries the user's edit
    assert steps[4]["hook"] == "inlet" and steps[4]["body"]["messages"][1]["role"] == "assistant"
    assert steps[3]["body"]["messages"][1]["content"] != edited  # what the server first answered

    def emitter(i):
        async def emit(e):
            emitted.append((i, e))
        return emit

    for i, st in enumerate(steps[:-1]):
        if st["hook"] == "inlet":
            asyncio.run(flt.inlet(copy.deepcopy(st["body"]), __user__=user, __metadata__=st["__metadata__"],
                                  __event_emitter__=emitter(i)))
        elif st["hook"] == "stream":
            flt.stream(copy.deepcopy(st["event"]), __metadata__=None)
        else:
            asyncio.run(flt.outlet(copy.deepcopy(st["body"]), __user__=user, __metadata__=st["__metadata__"],
                                   __event_emitter__=emitter(i)))
        versions.append(memory(srv, "support")["version"])
    assert versions[:4] == [0] * 4 and versions[4:] == [1] * (len(steps) - 5), versions
    taught = [(i, e["data"]["description"]) for i, e in emitted
              if e["type"] == "status" and e["data"]["description"].startswith("Taught")]
    assert taught == [(4, f"Taught memory support (version 1): \u201c{question}\u201d \u2192 \u201c{edited}\u201d")]
    info = memory(srv, "support")
    assert info["examples"] == 1 and info["prototypes"] == 1
    # this server now steers the same question with the taught reply
    chat = Chat(srv, make_filter(srv, teach_edits=False), "x:support")
    _, miita = chat.complete([{"role": "user", "content": question}], {})
    assert miita["adapted"] and miita["steered_by"][0]["answer"] == edited

    act = load_function("miita_teach").Action()
    act.valves = act.Valves(base_url=srv.url, api_key=API_KEY)
    action = steps[-1]
    assert action["hook"] == "action" and action["body"]["messages"][-1].get("sources")
    asked = []
    fix = "Please contact the shipping desk; a lost parcel is refunded after 14 days."

    async def call(e):
        asked.append(e)
        return fix

    async def emit(e):
        emitted.append((len(steps) - 1, e))

    out = asyncio.run(act.action(copy.deepcopy(action["body"]), __user__=user, __event_emitter__=emit,
                                 __event_call__=call, __id__="wrong"))
    assert out is None and len(asked) == 1 and question in asked[0]["data"]["message"]
    assert f"steered by the taught answer(s) \u201c{edited}\u201d" in asked[0]["data"]["message"]
    info = memory(srv, "support")
    assert info["version"] == 2 and info["examples"] == 2


# ---------------------------------------------------------------------------------------- Open WebUI


def test_with_real_open_webui():
    """Where Open WebUI is installed: its own loader parses the metadata and picks the types."""
    try:
        from open_webui.utils.plugin import extract_frontmatter  # type: ignore
    except ImportError as exc:
        pytest.skip(f"open_webui is not importable here ({exc}); the payloads are written from its source")
    for name in ("miita_feedback", "miita_teach"):
        text = (FUNCTIONS / f"{name}.py").read_text("utf-8")
        assert extract_frontmatter(text) == frontmatter(text)


def test_in_a_running_open_webui(tmp_path):
    """integrations/open_webui/e2e.py against a running Open WebUI and ``miita-edge serve``, given by
    MIITA_OPEN_WEBUI_URL, MIITA_SERVE_URL, MIITA_SERVE_KEY and MIITA_SERVE_MEMORY (a new, empty
    memory; docs/serving.md, "In a real Open WebUI"): the page is driven in Chromium and every
    check must pass."""
    import os

    need = ("MIITA_OPEN_WEBUI_URL", "MIITA_SERVE_URL", "MIITA_SERVE_KEY", "MIITA_SERVE_MEMORY")
    missing = [n for n in need if not os.environ.get(n)]
    if missing:
        pytest.skip(f"no running Open WebUI given ({', '.join(missing)} unset)")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    sys.path.insert(0, str(FUNCTIONS))
    try:
        import e2e  # type: ignore
    finally:
        sys.path.remove(str(FUNCTIONS))
    env = os.environ
    assert e2e.main(["--webui", env["MIITA_OPEN_WEBUI_URL"], "--server", env["MIITA_SERVE_URL"],
                     "--api-key", env["MIITA_SERVE_KEY"], "--memory", env["MIITA_SERVE_MEMORY"],
                     "--shots", str(tmp_path / "shots")]) == 0
