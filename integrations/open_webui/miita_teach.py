"""
title: miita-edge teach
author: miita-edge
version: 0.1.0
license: Apache-2.0
description: Buttons under an answer: teach the miita-edge memory this answer, or mark it wrong and type the right one.
required_open_webui_version: 0.5.0
"""
# An Open WebUI Action function for chats with `miita-edge serve` (the companion of the Filter
# miita_feedback.py). Paste it into Admin Panel -> Functions, enable it (Global, or on the
# miita-edge models) and set its Valves. It adds two buttons under each answer:
#   - "Teach this answer": after editing an answer, teach it now (the Filter teaches an edit when
#     the chat goes on); also for an answer that was right, to make it recur.
#   - "Wrong answer": the thumbs-down that teaches: a dialog asks for the right answer (an
#     `input` event through __event_call__), and that is taught for the question the answer
#     answered. Cancelling or leaving it empty teaches nothing.
# The example sent is {"input": the user message before the answer, "output": the answer}, to
# `POST {base_url}/v1/memories/{memory}/examples`, where memory is the Valves' or the one the
# chat's model id names (`MODEL:NAME` -> NAME, the server's rule). Each function is pasted on its
# own, so this file carries its own small HTTP helper.
from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any, Awaitable, Callable, Optional

from pydantic import BaseModel, Field

Emitter = Optional[Callable[[dict], Awaitable[Any]]]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _post(base_url: str, api_key: str, memory: str, examples: list[dict], timeout: float) -> dict:
    url = f"{base_url.rstrip('/')}/v1/memories/{urllib.request.quote(memory, safe='')}/examples"
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    req = urllib.request.Request(url, data=json.dumps(examples).encode(), method="POST", headers=headers)
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


class Action:
    actions = [
        {"id": "teach", "name": "Teach this answer"},
        {"id": "wrong", "name": "Wrong answer"},
    ]

    class Valves(BaseModel):
        base_url: str = Field(default="http://127.0.0.1:8080", description="miita-edge serve's address.")
        api_key: str = Field(default="", description="miita-edge serve's --api-key (empty: none).")
        memory: str = Field(default="", description="Teach this memory (empty: the chat model's).")
        timeout: float = Field(default=60.0, description="Seconds to wait for a teach.")

    def __init__(self):
        self.valves = self.Valves()

    async def action(self, body: dict, __user__: Optional[dict] = None, __event_emitter__: Emitter = None,
                     __event_call__: Optional[Callable[[dict], Awaitable[Any]]] = None,
                     __id__: Optional[str] = None) -> None:
        """Returns nothing: Open WebUI's browser merges a returned dict's `messages` into the chat."""
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        index = next((i for i, m in enumerate(messages) if body.get("id") and m.get("id") == body["id"]), None)
        if index is None:  # no id: the last assistant message
            index = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "assistant"), None)
        if index is None or messages[index].get("role") != "assistant":
            await _status(__event_emitter__, "Nothing taught: this is not an answer")
            return None
        question = next((_text(m.get("content")) for m in reversed(messages[:index]) if m.get("role") == "user"), "")
        if not question.strip():
            await _status(__event_emitter__, "Nothing taught: no question before this answer")
            return None
        answer = _text(messages[index].get("content"))
        # the Filter stores the answer's `miita` object with its sources (when it was steered)
        miita = next((s["miita"] for s in messages[index].get("sources") or []
                      if isinstance(s, dict) and isinstance(s.get("miita"), dict)), {})
        if (__id__ or "").rsplit(".", 1)[-1] == "wrong":
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
            await _status(__event_emitter__, "Nothing taught: no answer given")
            return None
        memory = self.valves.memory or miita.get("memory") or str(body.get("model") or "").rsplit(":", 1)[-1]
        v = self.valves
        try:
            rep = await asyncio.to_thread(_post, v.base_url, v.api_key, memory,
                                          [{"input": question, "output": answer.strip()}], v.timeout)
        except RuntimeError as e:
            await _status(__event_emitter__, f"Could not teach memory {memory}: {e}")
            return None
        await _status(__event_emitter__, f"Taught memory {memory} (version {rep.get('version')}): "
                                         f"\u201c{question[:80]}\u201d \u2192 \u201c{answer.strip()[:80]}\u201d")
        return None


async def _status(emitter: Emitter, description: str) -> None:
    if emitter is not None:
        await emitter({"type": "status", "data": {"description": description, "done": True}})
