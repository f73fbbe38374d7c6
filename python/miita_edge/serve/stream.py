"""Server-sent events for ``stream: true``: tokens handed from the worker to the event loop as they
are sampled, with no stop string ever sent (a possible stop's prefix is held back until it is
known not to be one). The first event is awaited before the response starts, so an error before
any token (a context overflow, a bad memory) is a plain JSON error with its status. A client that
goes away ends the answer at its next token (``answer.Stopped``): the worker is free for the next
request instead of generating ``max_tokens`` tokens nobody reads."""
from __future__ import annotations

import asyncio
import json
import logging
import threading

from sse_starlette.sse import EventSourceResponse

from ..runtime.engine_types import stop_position
from .answer import Stopped, answer_job
from .errors import as_api_error
from .params import GenParams
from .worker import BACKGROUND, FOREGROUND

log = logging.getLogger("miita_edge.serve")


class _Cutter:
    """Per choice: the new, stop-free text of each ``so_far``."""

    def __init__(self, stops: list[str], after_text: bool):
        self.stops, self.after_text, self.sent = stops, after_text, 0
        self.hold = max((len(s) for s in stops), default=1) - 1

    def delta(self, so_far: str) -> str:
        # the engine's own rule (EngineConfig.stop_after_text), so the streamed text is the reply's
        cut = stop_position(so_far, self.stops, self.after_text)
        safe = so_far[:cut] if cut >= 0 else so_far[:max(0, len(so_far) - self.hold)]
        if len(safe) <= self.sent:
            return ""
        out, self.sent = safe[self.sent:], len(safe)
        return out


async def stream_answer(r, name, text, messages, p: GenParams, shape) -> EventSourceResponse:
    """``shape``: a ``routes_chat.Shape`` (chunk JSON for chat or completions)."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()
    cutters = [_Cutter(p.stop, r.engine.config.stop_after_text) for _ in range(p.n)]

    def on_token(i: int, so_far: str):  # worker thread
        d = cutters[i].delta(so_far)
        if d:
            loop.call_soon_threadsafe(q.put_nowait, ("delta", i, d))

    prio = BACKGROUND if p.task else FOREGROUND
    gone = threading.Event()
    fut = asyncio.ensure_future(r.run(answer_job, r, name, text, messages, p, on_token, gone, priority=prio))
    fut.add_done_callback(lambda f: q.put_nowait(("done", None, None)))
    first = await q.get()
    if first[0] == "done" and fut.exception() is not None:
        raise fut.exception()

    async def events():
        started = set()
        ev = first
        try:
            while True:
                kind, i, d = ev
                if kind == "delta":
                    if i not in started and shape.chat:
                        started.add(i)
                        yield {"data": shape.chunk(i, {"role": "assistant", "content": ""})}
                    yield {"data": shape.chunk(i, {"content": d})}
                else:
                    for out in _finish(fut, cutters, shape, started):
                        yield {"data": out}
                    yield {"data": "[DONE]"}
                    return
                ev = await q.get()
        finally:  # the client went away (sse-starlette cancels this generator) or the server is stopping
            if not fut.done():
                gone.set()
                fut.add_done_callback(_log_stopped)

    return EventSourceResponse(events(), ping=600)


def _log_stopped(fut) -> None:
    exc = None if fut.cancelled() else fut.exception()
    if isinstance(exc, Stopped):
        log.info("streamed answer stopped after %d tokens: %s", exc.tokens, exc.message)


def _finish(fut, cutters, shape, started):
    exc = fut.exception()
    if exc is not None:  # after the first token: the error as the stream's last event
        yield json.dumps(as_api_error(exc).body())
        return
    res = fut.result()
    for i, c in enumerate(res.choices):
        if i not in started and shape.chat:
            yield shape.chunk(i, {"role": "assistant", "content": ""})
        if len(c.text) > cutters[i].sent:  # a held-back tail that turned out not to be a stop
            yield shape.chunk(i, {"content": c.text[cutters[i].sent:]})
        last = i == len(res.choices) - 1
        yield shape.chunk(i, {}, c.finish, {"usage": res.usage, "miita": res.ext} if last else None)
