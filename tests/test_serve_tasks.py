"""Open WebUI's background task requests (tests/data/open_webui/: written from its source, and the
requests a real Open WebUI 0.12.4 sent to ``miita-edge serve``, recorded/server.json):
recognised by their templates' fixed phrases, answered unadapted with the reason in the ``miita``
object, and queued behind foreground jobs on the single worker; a 26 KB tool list the user did not
ask to call is accepted and answered with text."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from _serve_server import tiny_client  # noqa: E402

DATA = Path(__file__).parent / "data" / "open_webui"


def payload(name: str) -> dict:
    return json.loads((DATA / name).read_text("utf-8"))


def msgs(body: dict):
    from miita_edge.serve.types import ChatRequest

    return ChatRequest.model_validate(body)


@pytest.mark.parametrize("name,task", [("title.json", "title_generation"), ("tags.json", "tags_generation"),
                                       ("follow_up.json", "follow_up_generation"), ("chat_with_tools.json", None)])
def test_recorded_payloads_are_classified(name, task):
    from miita_edge.serve.tasks import background_task

    assert background_task(msgs(payload(name))) == task


def test_classification_phrases_and_overrides():
    from miita_edge.serve.tasks import background_task, classify

    def one(text, role="user"):
        return msgs({"model": "m", "messages": [{"role": role, "content": text}]})

    assert background_task(one("### Task:\nGenerate a concise title summarizing the chat history.\n")) \
        == "title_generation"  # the newer title template
    assert background_task(one("### Task:\nSomething custom\n<chat_history>\nUSER: hi\n</chat_history>")) == "task"
    assert background_task(one("Your task is to reflect the speaker's likely facial expression through a fitting "
                               "emoji. Interpret emotions...\n\nMessage: ```hi```")) == "emoji_generation"
    assert background_task(one("What is a good title for my essay on rivers?")) is None
    assert background_task(one("my card was charged twice")) is None
    tools = msgs({"model": "m", "messages": [
        {"role": "system", "content": "Available Tools: [" + "{}," * 5000 + "]\n\nYour task is to choose and "
                                      "return the correct tool(s) from the list of available tools based on the "
                                      "query."},
        {"role": "user", "content": "Query: History:\nUSER: weather?\nQuery: weather in Berlin"}]})
    assert classify(tools.messages) == "function_calling"
    forced = msgs({"model": "m", "messages": [{"role": "user", "content": "hi"}], "miita": {"background": True}})
    assert background_task(forced) == "task"
    body = payload("title.json")
    body["miita"] = {"background": False}
    assert background_task(msgs(body)) is None


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    d = tmp_path_factory.mktemp("tasks")
    with tiny_client(d, memories={"support": d / "support"}, n_ctx=2048) as c:
        r = c.post("/v1/memories/support/examples", json=[{"input": "My parcel never arrived, where is it?",
                                                          "output": "shipping desk"}] * 2)
        assert r.status_code == 200
        yield c


@pytest.mark.parametrize("name,task,reply", [
    ("title.json", "title_generation", {"title": "My parcel never arrived, where is it"}),
    ("tags.json", "tags_generation", {"tags": []}),
    ("follow_up.json", "follow_up_generation", {"follow_ups": []})])
def test_task_answered_by_rule(client, name, task, reply):
    """Title, tags and follow-ups get the rule's reply (the title from the chat's first user
    message), unadapted, with the reason in the miita object; streamed the same."""
    body = payload(name)
    body["model"] = "x:support"
    body.pop("max_completion_tokens", None)
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert json.loads(out["choices"][0]["message"]["content"]) == reply
    assert out["choices"][0]["finish_reason"] == "stop" and out["usage"]["completion_tokens"] == 0
    x = out["miita"]
    assert x == {"memory": "support", "version": None, "adapted": False, "reason": "background_task", "task": task}
    body["stream"] = True
    r = client.post("/v1/chat/completions", json=body)
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert r.text.rstrip().endswith("data: [DONE]")
    assert json.loads("".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)) == reply
    assert chunks[-1]["miita"] == x and chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_task_does_not_occupy_the_worker(client):
    """While the model worker is held by a job (a user's long answer), a title, tags and
    follow-up request are still answered: they never queue on the worker. A request that did
    would wait for the held job and the thread below would not finish (the gate opens only after)."""
    r = client.app.state.registry
    gate, answered = threading.Event(), []
    held = r.worker.submit(gate.wait)

    def tasks():
        for name in ("title.json", "tags.json", "follow_up.json"):
            body = dict(payload(name), model="x:support", stream=name == "tags.json")
            answered.append(client.post("/v1/chat/completions", json=body).status_code)

    t = threading.Thread(target=tasks)
    try:
        t.start()
        t.join(120)
        assert not t.is_alive(), "a background task waited for the model worker"
        assert answered == [200, 200, 200]
    finally:
        gate.set()
        held.result(30)
        t.join(30)


def test_a_forced_or_custom_task_still_uses_the_model(client):
    """``miita.background: true`` and a custom "### Task:" template have no rule reply: the model
    answers them, unadapted, behind the user's questions."""
    body = {"model": "x:support", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
            "miita": {"background": True}}
    out = client.post("/v1/chat/completions", json=body).json()
    assert out["miita"]["task"] == "task" and isinstance(out["miita"]["version"], int)


@pytest.mark.parametrize("text,title", [
    ("my parcel never arrived", "My parcel never arrived"),
    ("My parcel never arrived, where is it? It was due Monday.", "My parcel never arrived, where is it"),
    ("Hello there, I ordered a blue jacket two weeks ago and it never came", "Hello there"),
    ("  ", "New chat"),
    ("What do I need to travel to Japan and Korea next summer", "What do I need to travel to Japan"),
    ("x" * 80, "X" + "x" * 49),
])
def test_title_rule(text, title):
    from miita_edge.serve.task_reply import title_of

    assert title_of(text) == title


def test_title_is_made_from_the_first_user_message():
    from miita_edge.serve.task_reply import first_user_message

    prompt = ("### Task:\nGenerate a concise title summarizing the chat history.\n<chat_history>\n"
              "USER: first line\nsecond line\nASSISTANT: an answer\nUSER: later\n</chat_history>")
    assert first_user_message(msgs({"model": "m", "messages": [{"role": "user", "content": prompt}]}).messages) \
        == "first line\nsecond line"
    assert first_user_message(msgs({"model": "m", "messages": [{"role": "user", "content": "plain"}]}).messages) \
        == "plain"


def test_chat_with_26kb_of_tools_is_answered(client):
    body = payload("chat_with_tools.json")
    assert len(json.dumps(body["tools"])) >= 26 * 1024
    body["model"] = "x:support"
    r = client.post("/v1/chat/completions", json=body)  # stream: true, as Open WebUI sends it
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    last = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")][-1]
    assert last["miita"].get("task") is None and last["miita"]["adapted"] is True  # steered as usual
    body["stream"] = False
    out = client.post("/v1/chat/completions", json=body).json()
    assert out["choices"][0]["message"]["content"] is not None and out["choices"][0]["finish_reason"] in (
        "stop", "length")


def test_worker_runs_background_jobs_after_queued_foreground_ones():
    from miita_edge.serve.worker import BACKGROUND, FOREGROUND, Worker

    w, order, gate = Worker(), [], threading.Event()
    try:
        first = w.submit(gate.wait)  # holds the worker while the others queue
        futs = [w.submit(order.append, "title", priority=BACKGROUND), w.submit(order.append, "answer1"),
                w.submit(order.append, "tags", priority=BACKGROUND), w.submit(order.append, "teach",
                                                                              priority=FOREGROUND)]
        gate.set()
        for f in [first, *futs]:
            f.result(10)
        assert order == ["answer1", "teach", "title", "tags"]
        boom = w.submit(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            boom.result(10)
        assert w.submit(lambda: 7).result(10) == 7  # an error does not stop the worker
    finally:
        w.close()


def recorded_requests() -> list[dict]:
    """The chat requests a real Open WebUI sent (a chat, its title, follow-ups and tags, a teach)."""
    rec = json.loads((DATA / "recorded" / "server.json").read_text("utf-8"))["requests"]
    return [r for r in rec if r["path"] == "/v1/chat/completions"]


def test_requests_of_a_real_open_webui_are_classified():
    """Each recorded request's task as the instruction line of its prompt names it (checked here by
    hand-written phrases, independent of PHRASES), and the user's own chats are no task."""
    from miita_edge.serve.tasks import background_task

    expect = {"Generate a concise title": "title_generation", "Generate 1-3 broad tags": "tags_generation",
              "Predict 3-5 useful messages": "follow_up_generation"}
    reqs = recorded_requests()
    seen = set()
    for r in reqs:
        last = r["body"]["messages"][-1]["content"]
        want = next((t for k, t in expect.items() if last.startswith("### Task:\n" + k)), None)
        assert background_task(msgs(r["body"])) == want, last[:120]
        seen.add(want)
    assert seen == {None, *expect.values()}  # the recording holds every kind


def test_requests_of_a_real_open_webui_are_answered(client):
    """Replayed against this server (the recorded model id points at its memory): every request is
    answered, the tasks unadapted, and none of them moves the memory's version."""
    v0 = client.get("/v1/memories/support").json()["version"]
    for r in recorded_requests():
        body = dict(r["body"], model="x:support")
        out = client.post("/v1/chat/completions", json=body)
        assert out.status_code == 200, out.text
        if body.get("stream"):
            assert out.text.rstrip().endswith("data: [DONE]")
        else:
            x = out.json()["miita"]
            assert x["adapted"] is False and x["reason"] == "background_task"
    assert client.get("/v1/memories/support").json()["version"] == v0


def test_a_file_chat_is_the_users_question():
    """Open WebUI's RAG template also starts "### Task:": a chat with a file is answered as usual."""
    from miita_edge.serve.tasks import background_task

    rag = ("### Task:\nRespond to the user query using the provided context, incorporating inline citations "
           "in the format [id] **only when the <source> tag includes an explicit id attribute**.\n\n"
           "<context>\n<source id=\"1\">Parcels are refunded after 14 days.</source>\n</context>\n\n"
           "<user_query>\nmy parcel never arrived\n</user_query>")
    assert background_task(msgs({"model": "m", "messages": [{"role": "user", "content": rag}]})) is None
