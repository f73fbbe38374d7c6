"""Replies to Open WebUI's background tasks made by rule, without the model.

Why: the server has one llama.cpp context. Open WebUI sends a new chat's title request just
before the chat's first question, and tags and follow-ups after each answer; on the model each
one holds the worker for a whole answer, so the user's question waits behind it (a median first
token of 3.9 s against 1.05 s later in the chat, measured with Open WebUI 0.12.4), and a
270M-parameter model answers these prompts badly anyway. So the tasks whose answer Open WebUI
can do without get a fixed, well-formed reply here, on the event loop, and never reach the
worker: a title from the chat's first user message, and empty lists for tags, follow-ups,
search queries and tool calls (Open WebUI then goes on as if the feature were off).
Tasks the user asked for by hand (an image prompt, merging responses) and custom templates
recognised only as ``"task"`` still go to the model, queued behind the user's questions.
"""
from __future__ import annotations

import json
import re

from .chat import message_text

TITLE_WORDS, TITLE_CHARS = 8, 50
# the reply each rule-answered task gets, as its template asks for it (open_webui/config.py);
# "title_generation" is made from the chat (``title_of``)
FIXED = {
    "tags_generation": {"tags": []},
    "follow_up_generation": {"follow_ups": []},
    "query_generation": {"queries": []},
    "autocomplete_generation": {"text": ""},
    "function_calling": {"tool_calls": []},
    "emoji_generation": "",
}
RULE_TASKS = frozenset(FIXED) | {"title_generation"}
_HISTORY = re.compile(r"<chat_history>\s*(.*?)\s*(?:</chat_history>|$)", re.S)
_TURN = re.compile(r"^(USER|ASSISTANT):[ \t]?", re.M)


def first_user_message(messages) -> str:
    """The chat's first user message as the task's prompt quotes it (``USER: ...`` inside
    ``<chat_history>``); without a quoted history, the last user message's text."""
    text = ""
    for m in reversed(messages):
        if m.role == "user":
            try:
                text = message_text(m.content)
            except Exception:  # a part that is not text: no title from it
                text = ""
            break
    found = _HISTORY.search(text)
    if not found:
        return text.strip()
    history = found.group(1)
    marks = list(_TURN.finditer(history))
    for i, mark in enumerate(marks):
        if mark.group(1) == "USER":
            end = marks[i + 1].start() if i + 1 < len(marks) else len(history)
            return history[mark.end():end].strip()
    return ""


def title_of(text: str) -> str:
    """A short title from a message: its first sentence, first letter upper-case, at most
    TITLE_WORDS words and TITLE_CHARS characters; a longer sentence is cut at a comma (or ; :)
    when two words or more come before it, else after its first words. Pure."""
    flat = " ".join(text.split())
    sentence = re.split(r"(?<=[.?!])\s", flat, maxsplit=1)[0].rstrip(".?!") if flat else ""
    words = sentence.split(" ") if sentence else []
    if len(words) > TITLE_WORDS or len(sentence) > TITLE_CHARS:
        head = re.split(r"[,;:]", sentence, maxsplit=1)[0].split(" ")
        words = head if 2 <= len(head) < len(words) else words
    title = ""
    for w in words[:TITLE_WORDS]:
        if len(title) + len(w) + (1 if title else 0) > TITLE_CHARS:
            break
        title = f"{title} {w}" if title else w
    if not title and words:
        title = words[0][:TITLE_CHARS]
    title = title.rstrip(" .,;:!?-")
    return title[:1].upper() + title[1:] if title else "New chat"


def task_reply(task: str | None, messages) -> str | None:
    """The rule's reply to a background task, or None when the task goes to the model."""
    if task not in RULE_TASKS or messages is None:
        return None
    if task == "title_generation":
        return json.dumps({"title": title_of(first_user_message(messages))}, ensure_ascii=False)
    fixed = FIXED[task]
    return fixed if isinstance(fixed, str) else json.dumps(fixed)
