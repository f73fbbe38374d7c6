"""
title: miita-edge teach
author: miita-edge
version: 0.2.1
license: Apache-2.0
description: Buttons under an answer: teach the miita-edge memory this answer, mark it wrong and type the right one, or see and forget what was taught.
required_open_webui_version: 0.5.0
"""
# An Open WebUI Action function for chats with `miita-edge serve` (the companion of the Filter
# miita_feedback.py). Paste it into Admin Panel -> Functions -> Create, switch it on (Global, or on
# the miita-edge models) and set its Valves. It adds three buttons under each answer:
#   - "Teach this answer": teach the answer as it now reads (after an edit, without waiting for
#     the next message; or an answer that was right, to make it recur).
#   - "Wrong answer": the thumbs-down that teaches: a dialog asks for the right answer (an
#     `input` event through __event_call__), and that is taught for the question the answer
#     answered. Cancelling or leaving it empty teaches nothing.
#   - "Forget": lists what was taught from this chat (by the Filter or these buttons) and the
#     taught answers that steered this answer, and forgets the ones picked
#     (`DELETE {base_url}/v1/memories/{memory}/examples`, which removes every example with that
#     answer).
# A teach sends {"input": the user message before the answer, "output": the answer} to
# `POST {base_url}/v1/memories/{memory}/examples`, where memory is the Valves', the one that
# answered (from the Filter's source on the message) or the one the chat's model id names
# (`MODEL:NAME` -> NAME, the server's rule). An example already taught is not taught again. The
# Filter and this Action share a state file (the `state_file` Valve, the same default in both) of
# what was taught. Each function is pasted on its own, so this file carries its own helpers.
from __future__ import annotations

import asyncio
import json
import os
import re
import time
import urllib.error
import urllib.request
from typing import Any, Awaitable, Callable, Optional

from pydantic import BaseModel, Field

Emitter = Optional[Callable[[dict], Awaitable[Any]]]
STATE_NAME = "miita-edge-open-webui.json"  # as in miita_feedback.py


def default_state_file() -> str:
    base = os.environ.get("DATA_DIR") or os.path.join(os.path.expanduser("~"), ".miita-edge")
    return os.path.join(base, STATE_NAME)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _norm(text: str) -> str:
    return " ".join(text.split())


def _short(text: str, n: int = 80) -> str:
    text = _norm(text)
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def _key(memory: str, question: str, answer: str) -> str:  # miita_feedback.taught_key
    return json.dumps([memory, _norm(question), _norm(answer)], ensure_ascii=False)


def _request(method: str, base_url: str, api_key: str, path: str, body: Any, timeout: float) -> dict:
    url = f"{base_url.rstrip('/')}{path}"
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            message = json.loads(e.read())["error"]["message"]
        except Exception:
            message = e.reason
        raise RuntimeError(f"HTTP {e.code}: {message}") from None
    except (OSError, ValueError) as e:
        raise RuntimeError(f"{url}: {e}") from None


def _memory_path(memory: str) -> str:
    return f"/v1/memories/{urllib.request.quote(memory, safe='')}"


def _examples_path(memory: str) -> str:
    return f"{_memory_path(memory)}/examples"


def _load_taught(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    taught = data.get("taught") if isinstance(data, dict) else None
    return taught if isinstance(taught, dict) else {}


def _save_taught(path: str, entries: dict) -> None:
    """Write taught entries into the shared state file (merged: the entry written last wins; the
    Filter's recorded answers are kept), atomically."""
    if not path:
        return
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    taught = data.get("taught") if isinstance(data.get("taught"), dict) else {}
    for k, v in entries.items():
        if k not in taught or float(v.get("at", 0)) >= float(taught[k].get("at", 0)):
            taught[k] = v
    data["taught"] = taught
    data.setdefault("answers", {})
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)
    os.replace(tmp, path)


def forget_choices(messages: list[dict], index: int, chat_id: str, taught: dict) -> list[dict]:
    """What the Forget button offers: the examples taught from this chat (state file, and the
    sources the functions added to its messages) and the taught answers that steered the answer at
    `index`; one entry per (memory, answer), each {memory, output, input?, why}."""
    out: dict[tuple[str, str], dict] = {}

    def add(memory, output, question, why):
        if memory and isinstance(output, str) and output.strip():
            out.setdefault((memory, _norm(output)), {"memory": memory, "output": output.strip(),
                                                     "input": question, "why": why})

    for e in taught.values():
        if isinstance(e, dict) and e.get("chat_id") == chat_id and chat_id and not e.get("forgotten"):
            add(e.get("memory"), e.get("output"), e.get("input"), "taught in this chat")
    for m in messages:
        for s in m.get("sources") or []:
            e = s.get("miita_taught") if isinstance(s, dict) else None
            if isinstance(e, dict) and not taught.get(_key(e.get("memory", ""), e.get("input", ""),
                                                           e.get("output", "")), {}).get("forgotten"):
                add(e.get("memory"), e.get("output"), e.get("input"), "taught in this chat")
    for s in messages[index].get("sources") or []:
        miita = s.get("miita") if isinstance(s, dict) else None
        for st in (miita or {}).get("steered_by") or []:
            add(miita.get("memory"), st.get("answer"), None, "steered this answer")
    return list(out.values())


def parse_picks(typed: Any, n: int) -> Optional[list[int]]:
    """"1", "1,3", "2 3" or "all" -> 0-based indexes; None when it names nothing valid."""
    if not isinstance(typed, str) or not typed.strip():
        return None
    if typed.strip().lower() == "all":
        return list(range(n))
    parts = [p for p in re.split(r"[\s,;]+", typed.strip()) if p]
    if not parts or not all(p.isdigit() and 1 <= int(p) <= n for p in parts):
        return None
    return sorted({int(p) - 1 for p in parts})


class Action:
    actions = [
        {"id": "teach", "name": "Teach this answer"},
        {"id": "wrong", "name": "Wrong answer"},
        {"id": "forget", "name": "Forget"},
    ]

    class Valves(BaseModel):
        base_url: str = Field(default="http://127.0.0.1:8080", description="miita-edge serve's address.")
        api_key: str = Field(default="", description="miita-edge serve's --api-key (empty: none).")
        memory: str = Field(default="", description="Teach this memory (empty: the chat model's).")
        timeout: float = Field(default=60.0, description="Seconds to wait for a teach.")
        state_file: str = Field(default_factory=default_state_file, description="File shared with the Filter: "
                                "examples taught (empty: none).")

    def __init__(self):
        self.valves = self.Valves()

    async def action(self, body: dict, __user__: Optional[dict] = None, __event_emitter__: Emitter = None,
                     __event_call__: Optional[Callable[[dict], Awaitable[Any]]] = None,
                     __id__: Optional[str] = None) -> None:
        """Returns nothing: Open WebUI's browser merges a returned dict's `messages` into the chat."""
        emit = __event_emitter__
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        index = next((i for i, m in enumerate(messages) if body.get("id") and m.get("id") == body["id"]), None)
        if index is None:  # no id: the last assistant message
            index = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "assistant"), None)
        if index is None or messages[index].get("role") != "assistant":
            await _status(emit, "Nothing done: this is not an answer")
            return None
        sub = (__id__ or "").rsplit(".", 1)[-1]
        if sub == "forget":
            await self.forget(messages, index, str(body.get("chat_id") or ""), emit, __event_call__)
            return None
        question = next((_text(m.get("content")) for m in reversed(messages[:index]) if m.get("role") == "user"), "")
        if not question.strip():
            await _status(emit, "Nothing taught: no question before this answer")
            return None
        answer = _text(messages[index].get("content"))
        # the Filter stores the answer's `miita` object with its sources (when it was steered)
        miita = next((s["miita"] for s in messages[index].get("sources") or []
                      if isinstance(s, dict) and isinstance(s.get("miita"), dict)), {})
        if sub == "wrong":
            steered = ", ".join(f"\u201c{(x.get('answer') or '').strip()}\u201d" for x in miita.get("steered_by") or [])
            if __event_call__ is None:
                return None
            typed = await __event_call__({"type": "input", "data": {
                "title": "What is the right answer?",
                "message": f"The memory answered \u201c{answer.strip()[:200]}\u201d to \u201c{question[:200]}\u201d"
                           + (f", steered by the taught answer(s) {steered[:300]}" if steered else "")
                           + ". Type the answer it should give; it will be taught.",
                "placeholder": "the right answer"}})
            answer = typed if isinstance(typed, str) else ""
        if not answer.strip():
            await _status(emit, "Nothing taught: no answer given")
            return None
        memory = self.valves.memory or miita.get("memory") or str(body.get("model") or "").rsplit(":", 1)[-1]
        await self.teach(memory, question, answer.strip(), str(body.get("chat_id") or ""),
                         str(messages[index].get("id") or ""), emit)
        return None

    async def teach(self, memory: str, question: str, answer: str, chat_id: str, message_id: str,
                    emit: Emitter) -> None:
        v = self.valves
        key = _key(memory, question, answer)
        done = _load_taught(v.state_file).get(key) if v.state_file else None
        if isinstance(done, dict) and not done.get("forgotten") and isinstance(done.get("version"), int):
            try:  # a memory made anew (its version now below the one taught) does not hold it
                now = await asyncio.to_thread(_request, "GET", v.base_url, v.api_key,
                                              _memory_path(memory), None, v.timeout)
                if isinstance(now.get("version"), int) and now["version"] < done["version"]:
                    done = None
            except (RuntimeError, AttributeError):
                pass
        if isinstance(done, dict) and not done.get("forgotten"):
            await _status(emit, f"Not taught again: memory {memory} already holds \u201c{_short(question)}\u201d "
                                f"\u2192 \u201c{_short(answer)}\u201d (version {done.get('version')})")
            return
        try:
            rep = await asyncio.to_thread(_request, "POST", v.base_url, v.api_key, _examples_path(memory),
                                          [{"input": question, "output": answer}], v.timeout)
        except RuntimeError as e:
            await _status(emit, f"Could not teach memory {memory}: {e}")
            return
        entry = {"memory": memory, "input": question, "output": answer, "version": rep.get("version"),
                 "chat_id": chat_id, "message_id": message_id, "by": "button", "at": time.time()}
        try:
            _save_taught(v.state_file, {key: entry})
        except OSError:
            pass  # taught all the same; only the Filter's dedupe misses it
        if emit is not None:
            await emit({"type": "source", "data": {
                "source": {"name": f"miita-edge taught memory {memory} v{rep.get('version')}"},
                "document": [f"taught \u201c{question}\u201d \u2192 \u201c{answer}\u201d (a button)"],
                "metadata": [{"source": f"miita-edge memory {memory}", "name": "taught example"}],
                "miita_taught": entry}})
        await _status(emit, f"Taught memory {memory} (version {rep.get('version')}): "
                            f"\u201c{_short(question)}\u201d \u2192 \u201c{_short(answer)}\u201d")

    async def forget(self, messages: list[dict], index: int, chat_id: str, emit: Emitter,
                     call: Optional[Callable[[dict], Awaitable[Any]]]) -> None:
        """List what can be forgotten here; forget the picked answers."""
        v = self.valves
        taught = _load_taught(v.state_file) if v.state_file else {}
        choices = forget_choices(messages, index, chat_id, taught)
        if not choices:
            await _status(emit, "Nothing to forget: nothing was taught in this chat and no taught answer "
                                "steered this answer")
            return
        if call is None:
            return
        lines = [f"{i + 1}. memory {c['memory']}: "
                 + (f"\u201c{_short(c['input'], 60)}\u201d \u2192 " if c.get("input") else "")
                 + f"\u201c{_short(c['output'], 100)}\u201d ({c['why']})" for i, c in enumerate(choices)]
        typed = await call({"type": "input", "data": {
            "title": "Forget a taught answer",
            "message": "\n".join(lines) + "\n\nType the numbers to forget (e.g. 1 or 1,2) or all. Forgetting "
                       "an answer removes every example that teaches it.",
            "placeholder": "1"}})
        picks = parse_picks(typed, len(choices))
        if picks is None:
            await _status(emit, "Nothing forgotten" + ("" if not isinstance(typed, str) or not typed.strip()
                                                      else f": \u201c{_short(typed, 40)}\u201d names no entry"))
            return
        said, updates = [], {}
        for c in (choices[i] for i in picks):
            try:
                rep = await asyncio.to_thread(_request, "DELETE", v.base_url, v.api_key,
                                              _examples_path(c["memory"]), {"output": c["output"]}, v.timeout)
            except RuntimeError as e:
                said.append(f"Could not forget \u201c{_short(c['output'])}\u201d in memory {c['memory']}: {e}")
                continue
            said.append(f"Forgot \u201c{_short(c['output'])}\u201d in memory {c['memory']} (version "
                        f"{rep.get('version')}, {rep.get('removed_examples')} examples removed)")
            for k, e in taught.items():  # the Filter and the buttons may teach it again
                if isinstance(e, dict) and e.get("memory") == c["memory"] and _norm(e.get("output", "")) == _norm(
                        c["output"]):
                    updates[k] = {**e, "forgotten": True, "at": time.time()}
        try:
            _save_taught(v.state_file, updates)
        except OSError:
            pass
        await _status(emit, " \u00b7 ".join(said))


async def _status(emitter: Emitter, description: str) -> None:
    if emitter is not None:
        await emitter({"type": "status", "data": {"description": description, "done": True}})
