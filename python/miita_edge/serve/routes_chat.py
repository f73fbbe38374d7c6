"""``POST /v1/chat/completions`` and ``POST /v1/completions``."""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from fastapi import APIRouter, Depends, Request

from .answer import Choice, Result, answer_job
from .params import check_chat, check_completion, gen_params, refuse
from .responses import ERRORS, SSE, ChatCompletion, Completion
from .guard import StrictJSONRoute
from .security import auth, registry
from .stream import stream_answer
from .task_reply import task_reply
from .types import ChatRequest, CompletionRequest
from .worker import BACKGROUND, FOREGROUND

router = APIRouter(dependencies=[Depends(auth)], responses=ERRORS, route_class=StrictJSONRoute)


@dataclass
class Shape:
    """The JSON of one response (or stream chunk) for chat or completions."""

    chat: bool
    model: str
    rid: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self):
        self.rid = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]

    def chunk(self, i: int, delta: dict, finish: str | None = None, extra: dict | None = None) -> str:
        if self.chat:
            c = {"index": i, "delta": delta, "logprobs": None, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            c = {"index": i, "text": delta.get("content", ""), "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        out = {"id": self.rid, "object": obj, "created": self.created, "model": self.model, "choices": [c]}
        return json.dumps({**out, **(extra or {})})

    def full(self, res: Result) -> dict:
        choices = []
        for i, c in enumerate(res.choices):
            if self.chat:
                lp = None if c.logprobs is None else {"content": c.logprobs, "refusal": None}
                choices.append({"index": i, "message": {"role": "assistant", "content": c.text}, "logprobs": lp,
                                "finish_reason": c.finish})
            else:
                choices.append({"index": i, "text": c.text, "logprobs": completion_logprobs(c.logprobs),
                                "finish_reason": c.finish})
        return {"id": self.rid, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices, "usage": res.usage,
                "miita": res.ext}


def completion_logprobs(rows: list[dict] | None) -> dict | None:
    """The legacy completions layout of the same entries."""
    if rows is None:
        return None
    offsets, at = [], 0
    for r in rows:
        offsets.append(at)
        at += len(r["token"])
    return {"tokens": [r["token"] for r in rows], "token_logprobs": [r["logprob"] for r in rows],
            "top_logprobs": [{t["token"]: t["logprob"] for t in r["top_logprobs"]} for r in rows],
            "text_offset": offsets}


async def _serve(request: Request, body, text: str, messages, task: str | None):
    r = registry(request)
    name = r.resolve(body.model)
    p = gen_params(body, r.settings.default_max_tokens, task)
    if body.stream and p.top_logprobs is not None:
        raise refuse("logprobs", "not supported with stream: true")
    shape = Shape(chat=messages is not None, model=body.model)
    reply = task_reply(task, messages)
    if reply is not None:  # a background task answered by rule: the worker is not involved
        return rule_response(reply, name, p, shape, body.stream)
    if body.stream:
        return await stream_answer(r, name, text, messages, p, shape)
    prio = BACKGROUND if task else FOREGROUND
    res = await r.run(answer_job, r, name, text, messages, p, None, priority=prio)
    return shape.full(res)


def rule_response(reply: str, name: str | None, p, shape: Shape, stream: bool):
    """A background task's rule-made reply (``task_reply``), as a response or a stream; no model
    work, so ``version`` is null and usage counts no tokens."""
    lp = None if p.top_logprobs is None else []
    ext = {"memory": name, "version": None, "adapted": False, "reason": "background_task", "task": p.task}
    res = Result([Choice(reply, "stop", 0, lp) for _ in range(p.n)], 0, ext)
    if not stream:
        return shape.full(res)
    from sse_starlette.sse import EventSourceResponse

    def events():
        for i, c in enumerate(res.choices):
            if shape.chat:
                yield {"data": shape.chunk(i, {"role": "assistant", "content": ""})}
            if c.text:
                yield {"data": shape.chunk(i, {"content": c.text})}
            last = i == len(res.choices) - 1
            yield {"data": shape.chunk(i, {}, c.finish, {"usage": res.usage, "miita": ext} if last else None)}
        yield {"data": "[DONE]"}

    return EventSourceResponse(events(), ping=600)


# exclude_unset: the miita object keeps only the keys that apply (no "steered_by": null when unsteered)
@router.post("/v1/chat/completions", response_model=ChatCompletion, responses=SSE,
             response_model_exclude_unset=True)
async def chat_completions(request: Request, body: ChatRequest):
    text, task = check_chat(body)
    return await _serve(request, body, text, body.messages, task)


@router.post("/v1/completions", response_model=Completion, responses=SSE, response_model_exclude_unset=True)
async def completions(request: Request, body: CompletionRequest):
    return await _serve(request, body, check_completion(body), None, None)
