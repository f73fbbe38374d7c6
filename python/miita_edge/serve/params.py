"""A request's options as the answer job uses them: OpenAI client conventions applied, and every
option this server does not implement refused with a 400 that names it (docs/serving.md, table
"Supported and refused parameters"; llama-cpp-python's server is the reference for what a local
OpenAI server supports)."""
from __future__ import annotations

import secrets
from dataclasses import dataclass

from .chat import last_user_text
from .errors import APIError, bounded
from .tasks import background_task
from .types import ChatRequest, CompletionRequest

ROLES = ("system", "developer", "user", "assistant", "tool")
NEWLINE_STOP = "\n"  # every taught target ends in a newline: the memory's end-of-answer signal


@dataclass
class GenParams:
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop: list[str]
    n: int
    adapt: bool
    top_logprobs: int | None  # None: no logprobs; k >= 0: the chosen token's and the k most likely
    task: str | None  # a background task (Open WebUI's title, tags, ...): answered unadapted
    # the request set no max_tokens (Open WebUI sends none): an adapted answer may run as long as
    # the memory's longest taught answer (answer.reply_budget) instead of stopping at the default
    default_max: bool = False
    # the newline stop is the server's own (not a stop the request asked for): a steered answer
    # that follows a taught multi-line answer passes that answer's inner newlines (answer.py)
    newline_added: bool = False


def refuse(param: str, why: str) -> APIError:
    return APIError(400, f"{param}: {why}", "unsupported_parameter", param)


def gen_params(body: ChatRequest | CompletionRequest, default_max_tokens: int, task: str | None) -> GenParams:
    """seed < 0 (OpenAI clients send -1): random; max_tokens -1 or null: the default (which an
    adapted answer may pass, up to its memory's longest taught answer); top_p 0: greedy; the
    request's ``stop`` strings are added to the newline stop unless ``miita.newline_stop`` is false."""
    mt = next((v for v in (body.max_tokens, body.max_completion_tokens) if v is not None and v != -1), None)
    temperature = body.temperature or 0.0
    top_p = 1.0 if body.top_p is None else body.top_p
    if top_p == 0.0:
        temperature, top_p = 0.0, 1.0
    seed = 0 if body.seed is None else body.seed
    if seed < 0:
        seed = secrets.randbits(63)
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    added = body.miita.newline_stop and NEWLINE_STOP not in stops
    if added:
        stops.insert(0, NEWLINE_STOP)
    stops = [s for s in stops if s]
    return GenParams(default_max_tokens if mt is None else mt, temperature, top_p, seed, stops, body.n or 1,
                     body.miita.adapt and task is None, _top_logprobs(body), task, mt is None, added)


def _top_logprobs(body) -> int | None:
    if isinstance(body, CompletionRequest):
        return body.logprobs
    if body.top_logprobs and not body.logprobs:
        raise refuse("top_logprobs", "needs \"logprobs\": true")
    return (body.top_logprobs or 0) if body.logprobs else None


def check_common(body) -> None:
    """Options no answer here implements: a clear 400 rather than silently ignoring them."""
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(body, name):
            raise refuse(name, "repetition penalties are not supported (0 or null only)")
    if body.logit_bias:
        raise refuse("logit_bias", "not supported")


def check_chat(body: ChatRequest) -> tuple[str, str | None]:
    """Validate a chat request; return (the key text: the last user turn, the background task)."""
    check_common(body)
    rf = body.response_format or {}
    if rf.get("type", "text") != "text":
        raise refuse("response_format", f"type {bounded(rf.get('type'))} is not supported (no constrained "
                     "decoding): only {\"type\": \"text\"}")
    tc = body.tool_choice
    if tc is not None and tc not in ("none", "auto"):
        raise refuse("tool_choice", "tool calls are not supported: tools are accepted and answered with "
                     "text (tool_choice \"auto\" or \"none\" only)")
    fc = body.function_call
    if fc is not None and fc not in ("none", "auto"):
        raise refuse("function_call", "function calls are not supported")
    for i, m in enumerate(body.messages):
        if m.role not in ROLES:
            why = ("the deprecated \"function\" role is not supported; use \"tool\"" if m.role == "function"
                   else f"unknown role {bounded(m.role)} (one of {', '.join(ROLES)})")
            raise refuse(f"messages[{i}].role", why)
        if isinstance(m.content, list):
            for j, part in enumerate(m.content):
                _check_part(part, f"messages[{i}].content[{j}]")
    task = background_task(body)
    return last_user_text(body.messages), task


def _check_part(part: dict, where: str) -> None:
    """A content part is ``{"type": "text", "text": STRING}``; anything else is named exactly."""
    kind = part.get("type")
    if kind == "text":
        if not isinstance(part.get("text"), str):
            got = "missing" if "text" not in part else f"a {_json_type(part['text'])}, not a string"
            raise APIError(400, f"{where}.text: a text part's \"text\" must be a string ({got})", "invalid_input",
                           f"{where}.text")
        return
    what = "images are not supported (the model reads text)" if kind == "image_url" else \
        f"content part type {bounded(kind)} is not supported (only \"text\")"
    raise refuse(where, what)


def _json_type(v) -> str:
    if v is None:
        return "null"
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(v), type(v).__name__)


def check_completion(body: CompletionRequest) -> str:
    check_common(body)
    if body.echo:
        raise refuse("echo", "not supported")
    if body.suffix:
        raise refuse("suffix", "not supported (no infilling)")
    if body.best_of not in (None, 1):
        raise refuse("best_of", "not supported (use n)")
    prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
    if len(prompts) != 1 or not prompts[0].strip():
        raise APIError(400, "prompt: one non-empty string is supported", "invalid_input", "prompt")
    return prompts[0]
