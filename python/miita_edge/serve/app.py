"""``create_app()``: the FastAPI application (endpoints in docs/serving.md)."""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from sse_starlette.sse import EventSourceResponse

from ..errors import InputError, MiitaError
from ..streams import Example
from . import chat as chat_mod
from .errors import APIError, from_miita, validation_error
from .memories import Registry, info
from .page import PAGE
from .settings import Settings
from .types import ChatRequest, CompletionRequest, CreateMemory, Forget


class BodyLimit:
    """ASGI middleware: a body over ``limit`` bytes is answered 413 before any handler reads it."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        chunks, size, more = [], 0, True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":
                return
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            more = msg.get("more_body", False)
            if size > self.limit:
                err = APIError(413, f"request body over the limit of {self.limit} bytes", "body_too_large")
                return await JSONResponse(err.body(), status_code=413)(scope, receive, send)
        body, sent = b"".join(chunks), False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


def create_app(settings: Settings | None = None, registry: Registry | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app):
        app.state.registry = registry or Registry(settings)
        try:
            yield
        finally:
            app.state.registry.close()

    app = FastAPI(title="miita-edge", lifespan=lifespan)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)

    @app.exception_handler(APIError)
    async def _api(request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(MiitaError)
    async def _miita(request, exc: MiitaError):
        e = from_miita(exc)
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        e = validation_error(list(exc.errors()))
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(Exception)
    async def _other(request, exc: Exception):  # never a traceback in a response
        e = APIError(500, f"internal error: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}",
                     "internal_error")
        return JSONResponse(e.body(), status_code=500)

    def auth(request: Request) -> None:
        if settings.api_key and request.headers.get("authorization", "") != f"Bearer {settings.api_key}":
            raise APIError(401, "missing or wrong API key (Authorization: Bearer KEY)", "invalid_api_key")

    def reg(request: Request) -> Registry:
        return request.app.state.registry

    # ------------------------------------------------------------------ page, models
    @app.get("/", response_class=HTMLResponse)
    async def page():
        return PAGE

    @app.get("/v1/models", dependencies=[Depends(auth)])
    async def models(request: Request):
        r = reg(request)
        return {"object": "list", "data": [{"id": i, "object": "model", "created": 0, "owned_by": "miita-edge"}
                                           for i in r.model_ids()]}

    # ------------------------------------------------------------------ answering
    def _answer_job(r: Registry, name, text, messages, body, on_token):
        """On the worker: pin the memory's committed version, answer, describe the steering."""
        m = r.memory(name)
        adapt = body.miita.adapt and name is not None
        eng = m.engine
        override = None
        if messages is not None and not adapt:
            tmpl = _chat_template(eng)
            if tmpl:
                override = eng.tokenize(chat_mod.render_chat_template(tmpl, messages), add_bos=True)
        from ..method.extract import prompt_tokens

        toks = override if override is not None else prompt_tokens(eng, m.template, text, m.max_prompt_tokens)
        max_tokens = body.max_tokens or body.max_completion_tokens or settings.default_max_tokens
        if len(toks) + max_tokens > eng.config.n_ctx:
            raise APIError(400, f"prompt ({len(toks)} tokens) + max_tokens ({max_tokens}) exceeds the context of "
                           f"{eng.config.n_ctx} tokens", "context_length_exceeded", "max_tokens")
        stop = ["\n"] if body.stop is None else ([body.stop] if isinstance(body.stop, str) else list(body.stop))
        n_gen = [0]

        def counted(text_so_far):
            n_gen[0] += 1
            if on_token is not None:
                on_token(text_so_far)

        ans = m.ask(text, max_tokens=max_tokens, adapt=adapt, stop=stop, temperature=body.temperature or 0.0,
                    seed=body.seed or 0, top_p=body.top_p or 1.0, on_token=counted, prompt_tokens_override=toks)
        ext = {"memory": name, "version": m.version if name else None, "adapted": ans.adapted}
        if ans.adapted:
            steer = []
            seqs, counts = m.bank.answer_tokens(), m.bank.counts()  # views: no Prototype objects made
            for pid, s, w in zip(ans.prototypes, ans.scores, ans.weights):
                toks_j = seqs[pid]
                answer = eng.detokenize([int(t) for t in toks_j]).rstrip("\n") if len(toks_j) else None
                steer.append({"prototype": pid, "answer": answer, "weight": w, "score": s, "count": int(counts[pid])})
            ext.update(steered_by=steer, alphas=ans.alphas, eta=ans.eta)
        elif ans.reason:
            ext["reason"] = ans.reason  # why the memory did not steer (the relevance gate, adapt off, empty)
        finish = "length" if ans.stop_reason == "length" else "stop"
        usage = {"prompt_tokens": len(toks), "completion_tokens": n_gen[0], "total_tokens": len(toks) + n_gen[0]}
        return ans.text, finish, usage, ext

    def _chat_template(eng):
        if not hasattr(eng, "_miita_chat_template"):
            import llama_cpp.llama_cpp as L

            raw = L.llama_model_chat_template(eng._model, None)
            eng._miita_chat_template = raw.decode("utf-8", "replace") if raw else None
        return eng._miita_chat_template

    async def _serve(request: Request, body, chat: bool):
        r = reg(request)
        name = r.resolve(body.model)
        if chat:
            text, messages = chat_mod.last_user_text(body.messages), body.messages
        else:
            prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
            if len(prompts) != 1 or not prompts[0].strip():
                raise InputError("prompt: one non-empty string is supported")
            text, messages = prompts[0], None
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        if not body.stream:
            text_out, finish, usage, ext = await r.run(_answer_job, r, name, text, messages, body, None)
            choice = ({"index": 0, "message": {"role": "assistant", "content": text_out}, "finish_reason": finish}
                      if chat else {"index": 0, "text": text_out, "logprobs": None, "finish_reason": finish})
            return {"id": rid, "object": obj, "created": created, "model": body.model, "choices": [choice],
                    "usage": usage, "miita": ext}
        return await _stream(r, name, text, messages, body, chat, rid, created)

    async def _stream(r, name, text, messages, body, chat, rid, created):
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        stops = ["\n"] if body.stop is None else ([body.stop] if isinstance(body.stop, str) else list(body.stop))
        hold = max((len(s) for s in stops if s), default=1) - 1
        state = {"sent": 0}

        def on_token(so_far: str):  # worker thread: push the new, stop-free text
            cut = min([so_far.find(s) for s in stops if s and s in so_far], default=-1)
            safe = so_far[:cut] if cut >= 0 else so_far[:max(0, len(so_far) - hold)]
            if len(safe) > state["sent"]:
                delta, state["sent"] = safe[state["sent"]:], len(safe)
                loop.call_soon_threadsafe(q.put_nowait, ("delta", delta))

        fut = asyncio.ensure_future(r.run(_answer_job, r, name, text, messages, body, on_token))
        fut.add_done_callback(lambda f: q.put_nowait(("done", None)))
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta=None, finish=None, extra=None):
            if chat:
                c = {"index": 0, "delta": delta or {}, "finish_reason": finish}
            else:
                c = {"index": 0, "text": (delta or {}).get("content", ""), "logprobs": None, "finish_reason": finish}
            out = {"id": rid, "object": obj, "created": created, "model": body.model, "choices": [c]}
            if extra:
                out.update(extra)
            return json.dumps(out)

        # Pull the first event before answering, so that an error before any token (a context overflow,
        # a bad memory) is a plain JSON error with its status, not a broken stream.
        first = await q.get()
        if first[0] == "done" and fut.exception() is not None:
            raise fut.exception()

        async def events():
            if chat:
                yield {"data": chunk({"role": "assistant", "content": ""})}
            ev = first
            while True:
                if ev[0] == "delta":
                    yield {"data": chunk({"content": ev[1]})}
                else:
                    exc = fut.exception()
                    if exc is not None:
                        e = exc if isinstance(exc, APIError) else (from_miita(exc) if isinstance(exc, MiitaError)
                                                                   else APIError(500, f"internal error: {exc}"))
                        yield {"data": json.dumps(e.body())}
                    else:
                        text_out, finish, usage, ext = fut.result()
                        if len(text_out) > state["sent"]:  # held-back tail that turned out not to be a stop
                            yield {"data": chunk({"content": text_out[state["sent"]:]})}
                        yield {"data": chunk({}, finish, {"usage": usage, "miita": ext})}
                    yield {"data": "[DONE]"}
                    return
                ev = await q.get()

        return EventSourceResponse(events(), ping=600)

    @app.post("/v1/chat/completions", dependencies=[Depends(auth)])
    async def chat_completions(request: Request, body: ChatRequest):
        return await _serve(request, body, chat=True)

    @app.post("/v1/completions", dependencies=[Depends(auth)])
    async def completions(request: Request, body: CompletionRequest):
        return await _serve(request, body, chat=False)

    # ------------------------------------------------------------------ memory API
    @app.get("/v1/memories", dependencies=[Depends(auth)])
    async def list_memories(request: Request):
        r = reg(request)
        return {"object": "list", "data": [{"name": n, "model": f"{r.model_id}:{n}"} for n in r.dirs]}

    @app.post("/v1/memories", dependencies=[Depends(auth)])
    async def create_memory(request: Request, body: CreateMemory):
        r = reg(request)
        return await r.run(r.create, body.name, body.budget, body.template, body.preset)

    @app.get("/v1/memories/{name}", dependencies=[Depends(auth)])
    async def memory_info(request: Request, name: str):
        r = reg(request)
        r.known(name)
        return await r.run(lambda: info(name, r.memory(name)))

    @app.post("/v1/memories/{name}/examples", dependencies=[Depends(auth)])
    async def teach(request: Request, name: str):
        r = reg(request)
        r.known(name)
        try:
            payload = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError) as exc:
            raise APIError(400, f"malformed JSON body: {exc}", "json_invalid") from None
        budget = None
        if isinstance(payload, dict):
            budget = payload.get("budget")
            if budget is not None and not isinstance(budget, str):
                raise APIError(422, "budget: must be a string such as '64KiB', '1%' or 'none'", "invalid_type",
                               "budget")
            payload = payload.get("examples")
        if not isinstance(payload, list) or not payload:
            raise APIError(422, "body: a non-empty JSON list of {\"input\", \"output\"} objects (or "
                           "{\"examples\": [...], \"budget\": ...})", "invalid_type", "examples")
        examples = []
        for i, row in enumerate(payload):
            if not isinstance(row, dict):
                raise APIError(422, f"examples[{i}]: not an object", "invalid_type", f"examples[{i}]")
            for field in ("input", "output"):
                v = row.get(field)
                if not isinstance(v, str) or not v.strip():
                    what = "missing" if field not in row else "not a non-empty string"
                    raise APIError(422, f"examples[{i}].{field}: {what}", "invalid_value", f"examples[{i}].{field}")
            examples.append(Example(row["input"], row["output"], line=i))
        m, rep = await r.run(r.write, name, lambda m: m.ingest(examples, budget=budget, progress=False))
        out = rep.to_json()
        out.update(memory=name, version=m.version)
        return out

    @app.delete("/v1/memories/{name}/examples", dependencies=[Depends(auth)])
    async def forget(request: Request, name: str, body: Forget):
        r = reg(request)
        r.known(name)
        m, out = await r.run(r.write, name, lambda m: m.forget(body.output))
        out["memory"] = name
        return out

    return app
