"""
title: miita-edge feedback
author: miita-edge
version: 0.2.1
license: Apache-2.0
description: Teaches the miita-edge memory behind a chat the answers users correct by editing them, and shows what steered each answer.
required_open_webui_version: 0.5.17
"""
# An Open WebUI Filter function for chats with `miita-edge serve`. Paste this file into
# Admin Panel -> Functions -> Create, switch it on (Global, or on the miita-edge models) and set its
# Valves (base_url, api_key). It uses the standard library for HTTP and pydantic (part of Open WebUI).
#
# How an edited answer is found (Open WebUI sends no "edited" event to functions):
#   1. `stream` sees every chunk of the server's answer: it keeps the text the server returned and
#      the `miita` object of the last chunk, keyed by the message id Open WebUI gives the answer.
#   2. `outlet` (after the answer) records, per message id: the chat, the answer's turn (how many
#      assistant messages came before it), the user question it answers, the text the user was
#      shown (for "Continue Response", which appends to an answer under the same id, the whole
#      text as it now reads) and the `miita` object; and shows what steered the answer.
#      (Turns count the assistant messages with text: the browser leaves empty ones out.)
#   3. When the chat goes on, `inlet` (the next question's messages, without ids) and `outlet`
#      (the chat's stored messages, with ids) carry the history as the user left it. An assistant
#      message whose text (whitespace-normalised) differs from the recorded one -- matched by
#      message id, or else by chat, turn and question -- was edited: its question and the edited
#      text are taught as one example to the memory that answered (`miita.memory`).
#   Not taught, and said so in the chat: a text that is the recorded answer followed by a copy of
#   itself (a "Continue Response" the Filter did not see), an answer whose question was edited
#   too, an answer of the model without a memory. Each (memory, question, answer) is taught once,
#   whoever taught it: the Filter and the companion Action (miita_teach.py) share a small state
#   file (the `state_file` Valve), which also keeps the recorded answers across restarts of
#   Open WebUI and between its worker processes.
#   What was taught, or why an edit was not, is the last status line of the answer that follows
#   (kept with the message), and each taught example is also added to that answer's sources.
from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any, Awaitable, Callable, Optional

from pydantic import BaseModel, Field

# Open WebUI's background task prompts (title, tags, follow-ups, queries...) all start with this
# heading or quote the chat in these tags; they are not a user's question.
TASK_MARKERS = ("### Task:", "<chat_history>")
STATE_NAME = "miita-edge-open-webui.json"

Emitter = Optional[Callable[[dict], Awaitable[Any]]]


def default_state_file() -> str:
    """Open WebUI's data directory ($DATA_DIR) when it says where that is, else ~/.miita-edge."""
    base = os.environ.get("DATA_DIR") or os.path.join(os.path.expanduser("~"), ".miita-edge")
    return os.path.join(base, STATE_NAME)


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


def is_continuation(original: str, text: str) -> bool:
    """`text` is `original` followed by another copy of it, whole, cut or extended: what "Continue
    Response" leaves when the server answers the question again (it does not resume a reply)."""
    o, t = normalized(original), normalized(text)
    if not o or len(t) <= len(o) or not t.startswith(o):
        return False
    rest = t[len(o):].strip()
    return bool(rest) and (o.startswith(rest) or rest.startswith(o))


def taught_key(memory: str, question: str, answer: str) -> str:
    return json.dumps([memory, normalized(question), normalized(answer)], ensure_ascii=False)


def short(text: str, n: int = 80) -> str:
    text = normalized(text)
    return text if len(text) <= n else text[: n - 1] + "\u2026"


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


def memory_version(base_url: str, api_key: str, memory: str, timeout: float) -> Optional[int]:
    """`GET {base}/v1/memories/{memory}`'s version, or None when it cannot be read."""
    url = f"{base_url.rstrip('/')}/v1/memories/{urllib.request.quote(memory, safe='')}"
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            v = json.loads(r.read()).get("version")
    except (OSError, ValueError, AttributeError):
        return None
    return v if isinstance(v, int) else None


def made_anew(entry: dict, version_now: Optional[int]) -> bool:
    """Whether the memory that ``entry`` says was taught has since been made anew (deleted and
    created again under its name, or replaced): a memory's version only grows, so one now below the
    version the teach reported is another memory, which does not hold the example."""
    taught_at = entry.get("version")
    return isinstance(taught_at, int) and version_now is not None and version_now < taught_at


def steering_summary(miita: dict) -> str:
    """One line: which taught answers steered this answer, or why none did."""
    where = f"memory {miita.get('memory')} v{miita.get('version')}"
    if miita.get("adapted"):
        parts = [f"\u201c{(s.get('answer') or '').strip()}\u201d (weight {s.get('weight', 0):.2f}, "
                 f"{s.get('count', 0)} example{'s' if s.get('count') != 1 else ''})"
                 for s in miita.get("steered_by") or []]
        return f"Steered by {where}: " + ", ".join(parts)
    return f"Not steered by {where}: {miita.get('reason') or 'no memory'}"


# ---------------------------------------------------------------------------------- the state file
def load_state(path: str) -> dict:
    """The shared state file's content ({"answers": {id: record}, "taught": {key: entry}}); empty
    when there is none or it cannot be read (a broken file must not stop the chat)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {"answers": {}, "taught": {}}
    answers = data.get("answers") if isinstance(data.get("answers"), dict) else {}
    taught = data.get("taught") if isinstance(data.get("taught"), dict) else {}
    return {"answers": answers, "taught": taught}


def merge_state(into: dict, other: dict, max_answers: int) -> dict:
    """Union of two states: per answer id and per taught key, the entry written last wins (a
    forgotten example stays forgotten); the answers kept are the newest `max_answers`."""
    for part in ("answers", "taught"):
        for k, v in other.get(part, {}).items():
            if not isinstance(v, dict):
                continue
            mine = into[part].get(k)
            if mine is None or float(v.get("at", 0)) >= float(mine.get("at", 0)):
                into[part][k] = v
    if len(into["answers"]) > max_answers:
        keep = sorted(into["answers"].items(), key=lambda kv: float(kv[1].get("at", 0)))[-max_answers:]
        into["answers"] = dict(keep)
    return into


def save_state(path: str, state: dict, max_answers: int) -> None:
    """Merge `state` into the file (another process may have written) and write it atomically."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    merged = merge_state(load_state(path), state, max_answers)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(merged, f, ensure_ascii=False)
    os.replace(tmp, path)


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
    at: float = 0.0


@dataclass
class Edit:
    rec: Answer
    text: str  # the text the user left in the answer's place
    question: str  # the question before it now
    question_edited: bool = False


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
        state_file: str = Field(default_factory=default_state_file, description="File shared with the Action: "
                                "answers recorded and examples taught (empty: kept in memory only).")

    def __init__(self):
        self.valves = self.Valves()
        self.answers: "OrderedDict[str, Answer]" = OrderedDict()  # message id -> Answer
        self.streams: "OrderedDict[str, dict]" = OrderedDict()  # message id -> {"text": [...], "miita": ...}
        self.taught: dict[str, dict] = {}  # taught_key -> {memory, input, output, version, message_id, ...}
        self.reports: list[dict] = []  # the server's teach reports, newest last (bounded)
        self.pending: "OrderedDict[str, list[str]]" = OrderedDict()  # answer id -> notes for its outlet
        self.noted: set[tuple[str, str]] = set()  # (message id, why) said once already
        self._state_seen: Optional[tuple[str, float]] = None

    # ------------------------------------------------------------------ hooks
    async def inlet(self, body: dict, __user__: Optional[dict] = None, __metadata__: Optional[dict] = None,
                    __event_emitter__: Emitter = None) -> dict:
        if not is_task(body, __metadata__):
            md = __metadata__ or {}
            self._load()
            chat_id = md.get("chat_id") or body.get("chat_id") or ""
            notes = await self._teach_edits(body.get("messages") or [], chat_id, __event_emitter__)
            target = md.get("message_id") or body.get("id")
            if notes and target:  # repeated as the answer's last status line by its outlet
                self.pending.setdefault(target, []).extend(notes)
                while len(self.pending) > 100:
                    self.pending.popitem(last=False)
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
        self._load()
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        chat_id = body.get("chat_id") or md.get("chat_id") or ""
        message_id = body.get("id") or md.get("message_id")
        self._note_taught_sources(messages)
        notes = await self._teach_edits(messages, chat_id, __event_emitter__, skip_id=message_id)
        notes = (self.pending.pop(message_id, []) if message_id else []) + notes
        streamed = self.streams.pop(message_id, None) if message_id else None
        index = next((i for i, m in enumerate(messages) if message_id and m.get("id") == message_id), None)
        miita = (streamed or {}).get("miita")
        if index is not None and messages[index].get("role") == "assistant" and not (
                miita and miita.get("reason") == "background_task"):
            notes += self._record(messages, index, chat_id, message_id, body, streamed)
            if self.valves.show_steering and miita:
                notes.append(steering_summary(miita))
                await self._show_sources(miita, __event_emitter__)
        if notes:  # one line, the answer's last status: the status history keeps it with the message
            await _status(__event_emitter__, " \u00b7 ".join(notes))
        self._save()
        return body

    # ------------------------------------------------------------------ recording
    def _record(self, messages: list[dict], index: int, chat_id: str, message_id: str, body: dict,
                streamed: Optional[dict]) -> list[str]:
        """Record the answer at `index`; a note when it is a continued answer."""
        shown = text_of(messages[index].get("content"))
        streamed_text = "".join((streamed or {}).get("text") or [])
        prev = self.answers.get(message_id)
        # "Continue Response" streams more text into the same message id: what the user sees is the
        # stored text, the earlier part and the continuation together
        continued = prev is not None or (bool(streamed_text.strip()) and normalized(shown) != normalized(
            streamed_text) and normalized(shown).endswith(normalized(streamed_text)))
        original = shown if continued and shown.strip() else (streamed_text or shown)
        question = next((text_of(m.get("content")) for m in reversed(messages[:index]) if m.get("role") == "user"), "")
        turn = sum(1 for m in messages[:index] if counts_as_turn(m))
        miita = (streamed or {}).get("miita") or (prev.miita if prev else None)
        self.answers[message_id] = Answer(chat_id, message_id, turn, question, original,
                                          str(body.get("model") or ""), miita, time.time())
        self.answers.move_to_end(message_id)
        while len(self.answers) > self.valves.max_tracked:
            self.answers.popitem(last=False)
        if continued:
            return ["Continued answer: recorded as the model's own text, not taught (edit it to teach a correction)"]
        return []

    def _note_taught_sources(self, messages: list[dict]) -> None:
        """Examples the Action taught (it adds them to the message's sources): taught, not again."""
        for m in messages:
            for s in m.get("sources") or []:
                entry = s.get("miita_taught") if isinstance(s, dict) else None
                if isinstance(entry, dict) and {"memory", "input", "output"} <= set(entry):
                    key = taught_key(entry["memory"], entry["input"], entry["output"])
                    if key not in self.taught:
                        self.taught[key] = {**entry, "at": float(entry.get("at", 0))}

    # ------------------------------------------------------------------ edits
    def edits(self, messages: list[dict], chat_id: str, skip_id: Optional[str] = None) -> list[Edit]:
        """Every answer whose text differs from the recorded one (an edit, or a question edited too)."""
        out, question, turn = [], "", 0
        for m in messages:
            if not isinstance(m, dict):
                continue
            if m.get("role") == "user":
                question = text_of(m.get("content"))
            elif m.get("role") == "assistant":
                text = text_of(m.get("content"))
                skip = skip_id is not None and m.get("id") == skip_id
                found = None if skip else self._recorded(m.get("id"), chat_id, turn, question, text)
                turn += counts_as_turn(m)
                if found is not None and normalized(text) and normalized(text) != normalized(found[0].original):
                    out.append(Edit(found[0], text, question, found[1]))
        return out

    def _recorded(self, message_id: Optional[str], chat_id: str, turn: int, question: str,
                  text: str) -> Optional[tuple[Answer, bool]]:
        """(the recorded answer, whether its question now reads differently), or None."""
        if message_id:
            rec = self.answers.get(message_id)
            return None if rec is None else (rec, normalized(rec.question) != normalized(question))
        if not chat_id:
            return None  # without an id or a chat there is nothing to match the answer by
        here = [a for a in self.answers.values() if a.chat_id == chat_id and a.turn == turn]
        if not here or any(normalized(a.original) == normalized(text) for a in here):
            return None  # unknown, or one of the answers generated here (regenerations share a turn)
        same = [a for a in here if a.question == question]
        return (same[-1], False) if same else (here[-1], True)

    async def _teach_edits(self, messages: list, chat_id: str, emitter: Emitter,
                           skip_id: Optional[str] = None) -> list[str]:
        """Teach the edits; the notes (taught, or why not) for the answer this request makes."""
        if not self.valves.teach_edits:
            return []
        notes = []
        for e in self.edits(messages, chat_id, skip_id):
            rec = e.rec
            memory = self.valves.memory or (rec.miita or {}).get("memory") or memory_of_model(rec.model)
            why = None
            if e.question_edited:
                why = (f"Edit not taught: the question before it was edited too (now \u201c{short(e.question)}\u201d); "
                       "press \u201cTeach this answer\u201d to teach the pair as it reads")
            elif is_continuation(rec.original, e.text):
                why = "Not taught: the answer is its own text repeated (\u201cContinue Response\u201d), not an edit"
            elif rec.miita is not None and not rec.miita.get("memory") and not self.valves.memory:
                why = "Edit not taught: the model answered without a memory (choose a MODEL:NAME model)"
            elif not rec.question.strip():
                why = "Edit not taught: no question before it"
            if why is not None:
                if (rec.message_id, why) not in self.noted:
                    self.noted.add((rec.message_id, why))
                    notes.append(why)
                    await _status(emitter, why)
                continue
            key = taught_key(memory, rec.question, e.text)
            done = self.taught.get(key)
            if done is not None and not done.get("forgotten") and made_anew(done, await asyncio.to_thread(
                    memory_version, self.valves.base_url, self.valves.api_key, memory, self.valves.timeout)):
                done = None  # the memory it was taught to is gone: teach this one
            if done is not None:  # taught already (here, by the Action, by another worker), or forgotten
                own = done.get("message_id") == rec.message_id and not done.get("forgotten")  # its own teach
                if not own and (rec.message_id, key) not in self.noted:
                    self.noted.add((rec.message_id, key))
                    notes.append(f"Not taught again: memory {memory} "
                                 + ("had \u201c" if done.get("forgotten") else "already holds \u201c")
                                 + f"{short(rec.question)}\u201d \u2192 \u201c{short(e.text)}\u201d"
                                 + (" (forgotten; \u201cTeach this answer\u201d teaches it again)"
                                    if done.get("forgotten") else f" (version {done.get('version')})"))
                continue
            note = await self.teach(memory, rec.question, e.text.strip(), emitter, chat_id, rec.message_id)
            if note:
                notes.append(note)
        return notes

    async def teach(self, memory: str, question: str, answer: str, emitter: Emitter, chat_id: str = "",
                    message_id: str = "") -> str:
        """Teach one example; report it (or the failure) as a status line and, when taught, as a
        source of the answer being made; return that line. Never raises: a failed teach must not
        stop the chat, and it is tried again when the chat next goes on."""
        v = self.valves
        try:
            rep = await asyncio.to_thread(post_examples, v.base_url, v.api_key, memory,
                                          [{"input": question, "output": answer}], v.timeout)
        except TeachError as e:
            line = f"Could not teach memory {memory}: {e}"
            await _status(emitter, line)
            return line
        entry = {"memory": memory, "input": question, "output": answer, "version": rep.get("version"),
                 "chat_id": chat_id, "message_id": message_id, "by": "edit", "at": time.time()}
        self.taught[taught_key(memory, question, answer)] = entry
        self.reports = (self.reports + [rep])[-100:]
        self._save()
        line = (f"Taught memory {memory} (version {rep.get('version')}): "
                f"\u201c{short(question)}\u201d \u2192 \u201c{short(answer)}\u201d")
        await _status(emitter, line)
        if emitter is not None:
            await emitter({"type": "source", "data": {
                "source": {"name": f"miita-edge taught memory {memory} v{rep.get('version')}"},
                "document": [f"taught \u201c{question}\u201d \u2192 \u201c{answer}\u201d (an edited answer)"],
                "metadata": [{"source": f"miita-edge memory {memory}", "name": "taught example"}],
                "miita_taught": entry,  # the Action's Forget button lists it
            }})
        return line

    # ------------------------------------------------------------------ state
    def _load(self) -> None:
        """Bring in what the state file holds that this instance has not seen (an Action's teach,
        another worker's answers, the records from before a restart)."""
        path = self.valves.state_file
        if not path:
            return
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            return
        if self._state_seen == (path, mtime):
            return
        self._state_seen = (path, mtime)
        data = load_state(path)
        for mid, rec in data["answers"].items():
            mine = self.answers.get(mid)
            if mine is None or float(rec.get("at", 0)) > mine.at:
                try:
                    self.answers[mid] = Answer(**{k: rec[k] for k in Answer.__dataclass_fields__ if k in rec})
                except TypeError:
                    continue
        for key, entry in data["taught"].items():
            mine = self.taught.get(key)
            if mine is None or float(entry.get("at", 0)) > float(mine.get("at", 0)):
                self.taught[key] = entry

    def _save(self) -> None:
        path = self.valves.state_file
        if not path:
            return
        state = {"answers": {mid: asdict(a) for mid, a in self.answers.items()}, "taught": dict(self.taught)}
        try:
            save_state(path, state, self.valves.max_tracked)
            self._state_seen = (path, os.stat(path).st_mtime)
        except OSError:
            pass  # the chat goes on; the records stay in memory

    async def _show_sources(self, miita: dict, emitter: Emitter) -> None:
        if emitter is None or not miita.get("adapted"):
            return
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
