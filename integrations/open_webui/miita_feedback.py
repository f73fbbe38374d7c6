"""
title: miita-edge feedback
author: miita-edge
version: 0.1.0
license: Apache-2.0
description: Teaches the miita-edge memory behind a chat the answers users correct by editing them, and shows what steered each answer.
required_open_webui_version: 0.5.17
"""
# An Open WebUI Filter function for chats with `miita-edge serve`. Paste this file into
# Admin Panel -> Functions, enable it (Global, or on the miita-edge models) and set its Valves
# (base_url, api_key). It uses the standard library for HTTP and pydantic (part of Open WebUI).
#
# How an edited answer is found (Open WebUI sends no "edited" event to functions):
#   1. `stream` sees every chunk of the server's answer: it keeps the text the server returned and
#      the `miita` object of the last chunk, keyed by the message id Open WebUI gives the answer.
#   2. `outlet` (after the answer) records, per message id: the chat, the answer's turn (how many
#      assistant messages came before it), the user question it answers, that original text and
#      the `miita` object; and shows what steered the answer (a status line and a source).
#      (Turns count the assistant messages with text: the browser leaves empty ones out.)
#   3. When the chat goes on, `inlet` (the next question's messages, without ids) and `outlet`
#      (the chat's stored messages, with ids) carry the history as the user left it. An assistant
#      message whose text (whitespace-normalised) differs from the recorded original -- matched by
#      message id, or else by chat, turn and question -- was edited: its question and the edited
#      text are taught as one example to the memory that answered (`miita.memory`).
#   Each (memory, question, answer) is taught once per Filter instance. Open WebUI keeps one
#   instance per function in memory, so answers generated before a restart of Open WebUI (or in
#   another worker process) cannot be told apart from edits and are never taught: for those, the
#   companion Action (miita_teach.py) teaches a message at a click.
from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional

from pydantic import BaseModel, Field

# Open WebUI's background task prompts (title, tags, follow-ups, queries...) all start with this
# heading or quote the chat in these tags; they are not a user's question.
TASK_MARKERS = ("### Task:", "<chat_history>")

Emitter = Optional[Callable[[dict], Awaitable[Any]]]


def text_of(content: Any) -> str:
    """A message's text: a string, or the text parts of a content list (images are not text)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def normalized(text: str) -> str:
    return " ".join(text.split())


def memory_of_model(model_id: str) -> str:
    """The memory a model id names, by the server's rule: `MODEL:NAME` (any prefix) or `NAME`."""
    return model_id.rsplit(":", 1)[-1]


def counts_as_turn(message: dict) -> bool:
    """An assistant message with text: the browser leaves empty answers out of a request's
    messages, so turns are counted over the others on both sides."""
    return message.get("role") == "assistant" and bool(text_of(message.get("content")).strip())


def is_task(body: dict, metadata: Optional[dict]) -> bool:
    if (metadata or {}).get("task") or body.get("task"):
        return True
    users = [m for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "user"]
    last = text_of(users[-1].get("content")) if users else ""
    return last.lstrip().startswith(TASK_MARKERS[0]) or TASK_MARKERS[1] in last


class TeachError(Exception):
    pass


def post_examples(base_url: str, api_key: str, memory: str, examples: list[dict], timeout: float) -> dict:
    """`POST {base}/v1/memories/{memory}/examples`; the server's report, or TeachError with its message."""
    url = f"{base_url.rstrip('/')}/v1/memories/{urllib.request.quote(memory, safe='')}/examples"
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(url, data=json.dumps(examples).encode(), method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            message = json.loads(e.read())["error"]["message"]
        except Exception:
            message = e.reason
        raise TeachError(f"HTTP {e.code}: {message}") from None
    except (OSError, ValueError) as e:
        raise TeachError(f"{url}: {e}") from None


def steering_summary(miita: dict) -> str:
    """One line: which taught answers steered this answer, or why none did."""
    where = f"memory {miita.get('memory')} v{miita.get('version')}"
    if miita.get("adapted"):
        parts = [f"\u201c{(s.get('answer') or '').strip()}\u201d (weight {s.get('weight', 0):.2f}, "
                 f"{s.get('count', 0)} example{'s' if s.get('count') != 1 else ''})"
                 for s in miita.get("steered_by") or []]
        return f"Steered by {where}: " + ", ".join(parts)
    return f"Not steered by {where}: {miita.get('reason') or 'no memory'}"


@dataclass
class Answer:
    """What the server returned for one assistant message."""

    chat_id: str
    message_id: str
    turn: int  # assistant messages before this one in its chat
    question: str
    original: str
    model: str
    miita: Optional[dict]


class Filter:
    class Valves(BaseModel):
        priority: int = Field(default=0, description="Order among filters (lower runs first).")
        base_url: str = Field(default="http://127.0.0.1:8080", description="miita-edge serve's address.")
        api_key: str = Field(default="", description="miita-edge serve's --api-key (empty: none).")
        memory: str = Field(default="", description="Teach this memory (empty: the one that answered).")
        teach_edits: bool = Field(default=True, description="Teach answers the user edited.")
        show_steering: bool = Field(default=True, description="Show what steered each answer.")
        timeout: float = Field(default=60.0, description="Seconds to wait for a teach.")
        max_tracked: int = Field(default=5000, description="Answers remembered to detect edits.")

    def __init__(self):
        self.valves = self.Valves()
        self.answers: "OrderedDict[str, Answer]" = OrderedDict()  # message id -> Answer
        self.streams: "OrderedDict[str, dict]" = OrderedDict()  # message id -> {"text": [...], "miita": ...}
        self.taught: set[tuple[str, str, str]] = set()  # (memory, question, normalized answer)
        self.reports: list[dict] = []  # the server's teach reports, newest last (bounded)

    # ------------------------------------------------------------------ hooks
    async def inlet(self, body: dict, __user__: Optional[dict] = None, __metadata__: Optional[dict] = None,
                    __event_emitter__: Emitter = None) -> dict:
        if not is_task(body, __metadata__):
            chat_id = (__metadata__ or {}).get("chat_id") or body.get("chat_id") or ""
            await self._teach_edits(body.get("messages") or [], chat_id, __event_emitter__)
        return body

    def stream(self, event: dict, __metadata__: Optional[dict] = None) -> dict:
        message_id = (__metadata__ or {}).get("message_id")
        if message_id and isinstance(event, dict) and not (__metadata__ or {}).get("task"):
            rec = self.streams.setdefault(message_id, {"text": [], "miita": None})
            for choice in event.get("choices") or []:
                if isinstance(choice, dict) and choice.get("index", 0) == 0:
                    piece = (choice.get("delta") or {}).get("content")
                    if isinstance(piece, str):
                        rec["text"].append(piece)
            if isinstance(event.get("miita"), dict):
                rec["miita"] = event["miita"]
            while len(self.streams) > self.valves.max_tracked:
                self.streams.popitem(last=False)
        return event

    async def outlet(self, body: dict, __user__: Optional[dict] = None, __metadata__: Optional[dict] = None,
                     __event_emitter__: Emitter = None) -> dict:
        if is_task(body, __metadata__):
            return body
        md = __metadata__ or {}
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        chat_id = body.get("chat_id") or md.get("chat_id") or ""
        message_id = body.get("id") or md.get("message_id")
        await self._teach_edits(messages, chat_id, __event_emitter__, skip_id=message_id)
        streamed = self.streams.pop(message_id, None) if message_id else None
        index = next((i for i, m in enumerate(messages) if message_id and m.get("id") == message_id), None)
        if index is None or messages[index].get("role") != "assistant":
            return body
        miita = (streamed or {}).get("miita")
        if miita and miita.get("reason") == "background_task":
            return body
        question = next((text_of(m.get("content")) for m in reversed(messages[:index]) if m.get("role") == "user"), "")
        streamed_text = "".join((streamed or {}).get("text") or [])
        original = streamed_text or text_of(messages[index].get("content"))
        turn = sum(1 for m in messages[:index] if counts_as_turn(m))
        self.answers[message_id] = Answer(chat_id, message_id, turn, question, original,
                                          str(body.get("model") or ""), miita)
        while len(self.answers) > self.valves.max_tracked:
            self.answers.popitem(last=False)
        if self.valves.show_steering and miita and __event_emitter__:
            await self._show(miita, __event_emitter__)
        return body

    # ------------------------------------------------------------------ edits
    def edits(self, messages: list[dict], chat_id: str, skip_id: Optional[str] = None) -> list[tuple[Answer, str]]:
        """(the recorded answer, the text the user left in its place) for every edited answer."""
        out, question, turn = [], "", 0
        for m in messages:
            if not isinstance(m, dict):
                continue
            if m.get("role") == "user":
                question = text_of(m.get("content"))
            elif m.get("role") == "assistant":
                text = text_of(m.get("content"))
                skip = skip_id is not None and m.get("id") == skip_id
                rec = None if skip else self._recorded(m.get("id"), chat_id, turn, question, text)
                turn += counts_as_turn(m)
                if rec is not None and normalized(text) and normalized(text) != normalized(rec.original):
                    out.append((rec, text))
        return out

    def _recorded(self, message_id: Optional[str], chat_id: str, turn: int, question: str,
                  text: str) -> Optional[Answer]:
        if message_id:
            rec = self.answers.get(message_id)
            return rec if rec is not None and rec.question == question else None
        if not chat_id:
            return None  # without an id or a chat there is nothing to match the answer by
        same = [a for a in self.answers.values() if a.chat_id == chat_id and a.turn == turn and a.question == question]
        if not same or any(normalized(a.original) == normalized(text) for a in same):
            return None  # unknown, or one of the answers generated here (regenerations share a turn)
        return same[-1]

    async def _teach_edits(self, messages: list, chat_id: str, emitter: Emitter, skip_id: Optional[str] = None) -> None:
        if not self.valves.teach_edits:
            return
        for rec, text in self.edits(messages, chat_id, skip_id):
            memory = self.valves.memory or (rec.miita or {}).get("memory") or memory_of_model(rec.model)
            if rec.miita is not None and not rec.miita.get("memory") and not self.valves.memory:
                continue  # the frozen model answered: no memory to teach
            key = (memory, rec.question, normalized(text))
            if key in self.taught or not rec.question.strip():
                continue
            await self.teach(memory, rec.question, text.strip(), emitter)

    async def teach(self, memory: str, question: str, answer: str, emitter: Emitter) -> Optional[dict]:
        """Teach one example; report it (or the failure) as a status line. Never raises: a failed
        teach must not stop the chat, and it is tried again when the chat next goes on."""
        v = self.valves
        try:
            rep = await asyncio.to_thread(post_examples, v.base_url, v.api_key, memory,
                                          [{"input": question, "output": answer}], v.timeout)
        except TeachError as e:
            await _status(emitter, f"Could not teach memory {memory}: {e}")
            return None
        self.taught.add((memory, question, normalized(answer)))
        self.reports = (self.reports + [rep])[-100:]
        await _status(emitter, f"Taught memory {memory} (version {rep.get('version')}): "
                               f"\u201c{question[:80]}\u201d \u2192 \u201c{answer[:80]}\u201d")
        return rep

    async def _show(self, miita: dict, emitter: Callable[[dict], Awaitable[Any]]) -> None:
        await _status(emitter, steering_summary(miita))
        if miita.get("adapted"):
            steered = miita.get("steered_by") or []
            await emitter({"type": "source", "data": {
                "source": {"name": f"miita-edge memory {miita.get('memory')} v{miita.get('version')}"},
                "document": [f"taught answer \u201c{(s.get('answer') or '').strip()}\u201d: vote weight "
                             f"{s.get('weight', 0):.2f}, retrieval score {s.get('score', 0):.2f}, "
                             f"{s.get('count', 0)} taught examples (prototype {s.get('prototype')})"
                             for s in steered],
                "metadata": [{"source": f"miita-edge memory {miita.get('memory')}",
                              "name": f"prototype {s.get('prototype')}"} for s in steered],
                "miita": miita,  # stored with the message's sources; the Action reads it
            }})


async def _status(emitter: Emitter, description: str) -> None:
    if emitter is not None:
        await emitter({"type": "status", "data": {"description": description, "done": True}})
