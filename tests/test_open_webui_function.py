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
MEMORIES = ("plain", "edit", "outlet", "tasks", "action", "fail", "support",  # support: the recording's
            "cont", "button", "qedit", "restart", "forget", "anew")
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


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    """Open WebUI's data directory: where both functions keep their shared state file by default."""
    monkeypatch.setenv("DATA_DIR", str(tmp_path / "owui-data"))
    return tmp_path / "owui-data"


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
        seen = len(self.events)
        if inlet:
            body = asyncio.run(self.flt.inlet(body, __user__=t["user"], __metadata__=md,
                                              __event_emitter__=self.emitter("inlet")))
        text, miita = self.complete(body["messages"], md)
        message = template("outlet.json")["message"] | {"id": answer_id, "content": text}
        self.history.append(message)
        out = template("outlet.json")["body"] | {"model": self.model, "chat_id": self.chat_id, "id": answer_id,
                                                  "session_id": self.session_id,
                                                  "messages": copy.deepcopy(self.history)}
        asyncio.run(self.flt.outlet(out, __user__=t["user"], __metadata__=md, __event_emitter__=self.emitter("outlet")))
        self.attach_sources(message, seen)
        return {"id": answer_id, "content": text, "miita": miita}

    def attach_sources(self, message: dict, seen: int) -> None:
        """Open WebUI appends a source event's data to the sources of the message being made."""
        sources = [e["data"] for _, e in self.events[seen:] if e["type"] == "source"]
        if sources:
            message["sources"] = message.get("sources", []) + sources

    def continue_response(self, message_id: str) -> str:
        """"Continue Response" on an answer: the request carries the chat up to that answer (the
        answer last), Open WebUI appends what the server streams to the answer, under its id."""
        t = template("inlet.json")
        upto = next(i for i, m in enumerate(self.history) if m["id"] == message_id)
        body = t["body"] | {"model": self.model, "chat_id": self.chat_id, "id": message_id,
                            "session_id": self.session_id,
                            "messages": [{"role": m["role"], "content": m["content"]} for m in self.history[:upto + 1]]}
        md = t["metadata"] | {"chat_id": self.chat_id, "message_id": message_id, "session_id": self.session_id}
        seen = len(self.events)
        body = asyncio.run(self.flt.inlet(body, __user__=t["user"], __metadata__=md,
                                          __event_emitter__=self.emitter("inlet")))
        more, _ = self.complete(body["messages"], md)
        self.history[upto]["content"] += more
        out = template("outlet.json")["body"] | {"model": self.model, "chat_id": self.chat_id, "id": message_id,
                                                  "session_id": self.session_id,
                                                  "messages": copy.deepcopy(self.history[:upto + 1])}
        asyncio.run(self.flt.outlet(out, __user__=t["user"], __metadata__=md, __event_emitter__=self.emitter("outlet")))
        self.attach_sources(self.history[upto], seen)
        return self.history[upto]["content"]

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

    def last_status(self) -> str:
        """The status line an answer shows: the last one emitted (Open WebUI shows the last of a
        message's status history and keeps the history with the message)."""
        return self.statuses()[-1]


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
    line = f"Taught memory edit (version 1): \u201c{QUESTION}\u201d \u2192 \u201c{CORRECTION}\u201d"
    assert taught == [line]
    # the line stays the answer's last status (its steering line after it, not instead of it)
    assert chat.last_status().startswith(line + " \u00b7 ") and "steered by memory edit v1" in chat.last_status().lower()
    taught_sources = [e["data"]["miita_taught"] for h, e in chat.events if e["type"] == "source"
                      and "miita_taught" in e["data"]]
    assert [(t["input"], t["output"], t["version"]) for t in taught_sources] == [(QUESTION, CORRECTION, 1)]
    again = chat.send(QUESTION)
    assert again["content"].strip() == CORRECTION, again
    assert again["miita"]["adapted"] and again["miita"]["steered_by"][0]["answer"].strip() == CORRECTION
    top = again["miita"]["steered_by"][0]
    assert chat.statuses("outlet")[-1].startswith(
        f"Steered by memory edit v1: \u201c{CORRECTION}\u201d (weight {top['weight']:.2f}, 1 example)")
    sources = [e for h, e in chat.events if e["type"] == "source" and "miita" in e["data"]]
    assert len(sources) == 1 and CORRECTION in sources[0]["data"]["document"][0]
    chat.send("One more question?")  # the edited answer is still in the history: not taught again
    assert memory(srv, "edit")["version"] == 1 and len(flt.reports) == 1


@pytest.mark.parametrize("question, answer, asks", [
    ("What is the code for the bike lock in the garage?", "4417",
     ("what is the code for the bike lock in the garage", "WHAT IS THE CODE FOR THE BIKE LOCK IN THE GARAGE?",
      "What  is the code for the bike lock in the garage ?", "what's the code of the bike lock in the garage?")),
    ("my parcel never arrived", "Sorry about that! Please write to the shipping desk: shipping@example.com.",
     ("My parcel never arrived.", "the parcel I ordered never arrived")),
], ids=["label", "reply"])
def test_one_edit_answers_other_forms_of_its_question_in_a_new_chat(tmp_path, question, answer, asks):
    """Through the assistant, on the embedded model: one edited answer (one example, taught once)
    comes back corrected in a new chat for the question in other letter case, spacing and
    punctuation, and for a rewording; an unrelated question stays the frozen model's. Why the
    embedded model: how far one example reaches is what the model says about paraphrase
    (docs/method.md §5), which a tiny random model cannot say. The reply (a sentence, the usual
    correction in a chat) makes a memory that whitens its keys, whose reach is measured on
    paraphrase groups the whitening was not fitted on."""
    srv = Server("--memory", f"desk={tmp_path / 'desk'}", log=tmp_path / "server.log")
    try:
        model = srv.get("/v1/models")[1]["data"][0]["id"]
        flt = make_filter(srv)
        chat = Chat(srv, flt, f"{model}:desk")
        first = chat.send(question)
        assert not first["content"].strip().startswith(answer)
        chat.edit(first["id"], f" {answer}\n")
        chat.send("Thanks.")
        info = memory(srv, "desk")
        assert info["version"] == 1 and info["examples"] == 1, info
        new = Chat(srv, flt, f"{model}:desk")
        for form in asks:
            got = new.send(form)
            assert got["content"].strip() == answer and got["miita"]["adapted"], (form, got)
        other = new.send("How far away is the moon?")
        assert not other["miita"]["adapted"], other
    finally:
        srv.stop()


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
        return [(e.rec.message_id, e.text, e.question_edited) for e in flt.edits(messages, chat)]

    assert edited(inlet_view(["one", "two"])) == [] and edited(inlet_view([" uno\n", "two"])) == []
    assert edited(inlet_view(["fixed", "two"])) == [("a1b", "fixed", False)]
    assert edited(inlet_view(["one", "better two"])) == [("a3", "better two", False)]
    assert edited(inlet_view(["fixed", "two"]), chat="other") == []
    # the question edited too: found, and flagged (reported, not taught)
    assert edited(inlet_view(["fixed", "two"], questions=("changed question", q2))) == [("a1b", "fixed", True)]
    assert edited(inlet_view(["uno", "two"], questions=("changed question", q2))) == []  # the answer as given


def test_continue_response_is_not_taught(srv, model_id):
    """"Continue Response" appends a second answer to the first under the same id (the server
    answers the question again): the doubled text is recorded as the model's, the next message
    teaches nothing, and the answer says why."""
    flt = make_filter(srv)
    chat = Chat(srv, flt, f"{model_id}:cont")
    first = chat.send(QUESTION)
    doubled = chat.continue_response(first["id"])
    assert doubled.startswith(first["content"]) and len(doubled) > len(first["content"])
    assert chat.last_status().startswith("Continued answer: recorded as the model's own text, not taught")
    chat.send("Thanks.")
    assert memory(srv, "cont")["version"] == 0 and not flt.reports
    # the same doubled text seen by a Filter that never saw the continuation (its outlet lost):
    # taken for what it is by its shape, and said once
    other = Chat(srv, make_filter(srv, state_file=""), f"{model_id}:cont")
    again = other.send(QUESTION)
    other.edit(again["id"], again["content"] + " " + again["content"])
    other.send("Thanks.")
    other.send("And?")
    assert memory(srv, "cont")["version"] == 0
    why = "Not taught: the answer is its own text repeated (\u201cContinue Response\u201d), not an edit"
    assert other.statuses("inlet") == [why]


def test_is_continuation_shapes():
    f = load_function("miita_feedback")
    assert f.is_continuation("You need a pass", "You need a pass You need a passport and a visa.")
    assert f.is_continuation("billing", "billing\nbilling")
    assert f.is_continuation("abc def", "abc def abc")  # a cut second copy
    assert not f.is_continuation("billing", "billing")
    assert not f.is_continuation("billing", "the billing desk")
    assert not f.is_continuation("", "anything")


def test_an_edit_with_its_question_edited_is_reported_not_taught(srv, model_id):
    flt = make_filter(srv)
    chat = Chat(srv, flt, f"{model_id}:qedit")
    first = chat.send(QUESTION)
    chat.edit(first["id"], CORRECTION)
    chat.history[0]["content"] = "Can I get my money back?"  # the user edits the question too ("Save")
    chat.send("Thanks.")
    chat.send("Hello?")
    assert memory(srv, "qedit")["version"] == 0 and not flt.reports
    said = [s for s in chat.statuses("inlet") if s.startswith("Edit not taught")]
    assert said == ["Edit not taught: the question before it was edited too (now \u201cCan I get my money "
                    "back?\u201d); press \u201cTeach this answer\u201d to teach the pair as it reads"]
    assert chat.statuses("outlet")[-2].startswith(said[0])  # the "Thanks." answer's last status


def test_an_edit_survives_a_restart_of_open_webui(srv, model_id, state_dir):
    """The recorded answers live in the state file: a new Filter instance (Open WebUI restarted,
    or another worker process) still tells the edit from the model's answer and teaches it."""
    chat = Chat(srv, make_filter(srv), f"{model_id}:restart")
    first = chat.send(QUESTION)
    chat.edit(first["id"], CORRECTION)
    assert (state_dir / "miita-edge-open-webui.json").exists()
    chat.flt = make_filter(srv)  # restarted: nothing in memory
    chat.send("Thanks.")
    assert memory(srv, "restart")["version"] == 1 and len(chat.flt.reports) == 1
    chat.flt = make_filter(srv)  # and once taught, not again
    chat.send("Still there?")
    assert memory(srv, "restart")["version"] == 1 and not chat.flt.reports


def test_teach_button_then_next_message_teaches_once(srv, model_id):
    """"Teach this answer" on an edited answer, then the next message: one example, not two
    (the Action writes what it taught to the state file the Filter reads); a second click says so."""
    chat = Chat(srv, make_filter(srv), f"{model_id}:button")
    first = chat.send(QUESTION)
    chat.edit(first["id"], CORRECTION)
    version, emitted, _ = run_action(srv, chat, first["id"], "teach")
    assert version == 1 and emitted[-1]["data"]["description"].startswith("Taught memory button (version 1)")
    assert [e["data"]["miita_taught"]["output"] for e in emitted if e["type"] == "source"] == [CORRECTION]
    chat.send("Thanks.")
    chat.send("Bye.")
    info = memory(srv, "button")
    assert info["version"] == 1 and info["examples"] == 1 and not chat.flt.reports
    assert not [s for s in chat.statuses() if s.startswith("Taught")]
    version, emitted, _ = run_action(srv, chat, first["id"], "teach")
    assert version == 1 and emitted[-1]["data"]["description"].startswith(
        f"Not taught again: memory button already holds \u201c{QUESTION}\u201d")


def test_a_memory_made_anew_is_taught_again(srv, model_id, state_dir):
    """The state file says an example was taught to memory "anew" at version 3 (or 9), but the
    memory of that name is now at a lower version: it was made anew and does not hold the example,
    so the Filter's edit and the Action's button teach it instead of saying "already holds"."""
    flt = load_function("miita_feedback")
    entry = {"memory": "anew", "version": 3, "message_id": "an-earlier-chat", "by": "edit", "at": 1.0}
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "miita-edge-open-webui.json").write_text(json.dumps({"answers": {}, "taught": {
        flt.taught_key("anew", QUESTION, CORRECTION): {**entry, "input": QUESTION, "output": CORRECTION},
        flt.taught_key("anew", "Where is my parcel?", "shipping desk"):
            {**entry, "version": 9, "input": "Where is my parcel?", "output": "shipping desk"}}}))
    assert memory(srv, "anew")["version"] == 0
    chat = Chat(srv, make_filter(srv), f"{model_id}:anew")
    first = chat.send(QUESTION)
    chat.edit(first["id"], CORRECTION)
    chat.send("Thanks.")
    assert memory(srv, "anew")["version"] == 1
    assert chat.last_status().startswith("Taught memory anew (version 1)"), chat.statuses()
    version, emitted, _ = run_action(srv, chat, first["id"], "teach")  # now it does hold it
    assert version == 1 and emitted[-1]["data"]["description"].startswith("Not taught again")
    second = chat.send("Where is my parcel?")
    chat.edit(second["id"], "shipping desk")
    version, emitted, _ = run_action(srv, chat, second["id"], "teach")
    assert version == 2 and emitted[-1]["data"]["description"].startswith("Taught memory anew (version 2)")
    assert flt.made_anew({"version": 3}, 2) and not flt.made_anew({"version": 3}, 3)
    assert not flt.made_anew({"version": 3}, None) and not flt.made_anew({}, 0)


def test_forget_button_lists_and_forgets(srv, model_id):
    """"Forget" lists what was taught in the chat and what steered the answer; the picked answer
    is forgotten with the server's DELETE, and the Filter does not teach it again from the edit
    still in the chat."""
    chat = Chat(srv, make_filter(srv), f"{model_id}:forget")
    first = chat.send(QUESTION)
    chat.edit(first["id"], CORRECTION)
    second = chat.send("Thanks.")  # teaches the edit
    assert memory(srv, "forget")["examples"] == 1
    version, emitted, asked = run_action(srv, chat, second["id"], "forget", typed=None)  # cancelled
    assert version == 1 and emitted[-1]["data"]["description"] == "Nothing forgotten"
    listing = asked[0]["data"]["message"]
    assert listing.startswith(f"1. memory forget: \u201c{QUESTION}\u201d \u2192 \u201c{CORRECTION}\u201d "
                              "(taught in this chat)")
    version, emitted, _ = run_action(srv, chat, second["id"], "forget", typed="7")
    assert version == 1 and "names no entry" in emitted[-1]["data"]["description"]
    version, emitted, _ = run_action(srv, chat, second["id"], "forget", typed="1")
    info = memory(srv, "forget")
    assert version == 2 and info["examples"] == 0
    assert emitted[-1]["data"]["description"].startswith(f"Forgot \u201c{CORRECTION}\u201d in memory forget "
                                                         "(version 2, 1 examples removed)")
    chat.send("Anything else?")  # the edited answer is still in the chat: not taught again
    assert memory(srv, "forget")["version"] == 2
    assert any("forgotten" in s for s in chat.statuses("outlet"))
    version, emitted, asked = run_action(srv, chat, second["id"], "forget", typed="1")
    assert not asked and emitted[-1]["data"]["description"].startswith("Nothing to forget")


def test_forget_offers_the_answers_that_steered():
    """Without anything taught in the chat, the answers that steered the clicked answer (the
    Filter's source on it) are offered; pure, no server."""
    t = load_function("miita_teach")
    msgs = [{"id": "u", "role": "user", "content": "q"},
            {"id": "a", "role": "assistant", "content": "x", "sources": [
                {"miita": {"memory": "m", "steered_by": [{"answer": "shipping desk"}, {"answer": " "}]}}]}]
    assert t.forget_choices(msgs, 1, "c", {}) == [{"memory": "m", "output": "shipping desk", "input": None,
                                                   "why": "steered this answer"}]
    assert t.parse_picks("1, 2", 2) == [0, 1] and t.parse_picks("all", 3) == [0, 1, 2]
    assert t.parse_picks("0", 2) is None and t.parse_picks("x", 2) is None and t.parse_picks(None, 2) is None


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
    line = f"Taught memory support (version 1): \u201c{question}\u201d \u2192 \u201c{edited}\u201d"
    taught = [(i, e["data"]["description"]) for i, e in emitted
              if e["type"] == "status" and e["data"]["description"].startswith("Taught")]
    assert taught[0] == (4, line)  # at the second inlet, then again as that answer's last status line
    assert taught[1:] == [(7, line)]  # no steering line: the recorded stream calls carry no metadata
    info = memory(srv, "support")
    assert info["examples"] == 1 and info["prototypes"] == 1
    # this server now steers the same question with the taught reply
    chat = Chat(srv, make_filter(srv, teach_edits=False), "x:support")
    _, miita = chat.complete([{"role": "user", "content": question}], {})
    assert miita["adapted"] and miita["steered_by"][0]["answer"] == edited
    # taught once, the correction also answers its question in other letter case in a new chat (the
    # same key: case is folded), and leaves an unrelated support question to the frozen model. A
    # rewording is not asked here: whether one reaches is the model's reading, which a tiny random
    # model cannot give (test_one_edit_answers_other_forms_of_its_question_in_a_new_chat asks it
    # of the embedded model)
    _, miita = Chat(srv, make_filter(srv, teach_edits=False), "x:support").complete(
        [{"role": "user", "content": "My parcel never arrived"}], {})
    assert miita["adapted"] and miita["steered_by"][0]["answer"] == edited, miita
    _, miita = Chat(srv, make_filter(srv, teach_edits=False), "x:support").complete(
        [{"role": "user", "content": "how do I close my account?"}], {})
    assert not miita["adapted"], miita

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


# ---------------------------------------------------------------------------------------- the server


def test_serve_says_when_it_is_ready(srv):
    """docs/serving.md tells users to start Open WebUI once the server prints its ready line:
    printed once the socket listens (the fixture's server already answered a request)."""
    import time

    want = f"miita-edge serve: ready on {srv.url}\n"
    for _ in range(50):  # printed just after the socket is bound: a request may be answered a moment sooner
        if want in srv.log.read_text():
            break
        time.sleep(0.1)
    assert srv.log.read_text().count("miita-edge serve: ready on") == 1 and want in srv.log.read_text()


def test_ready_line_names_the_address():
    from miita_edge.serve.run import ready_line

    assert ready_line("127.0.0.1", 8080) == "miita-edge serve: ready on http://127.0.0.1:8080"
    assert ready_line("::1", 9000) == "miita-edge serve: ready on http://[::1]:9000"
