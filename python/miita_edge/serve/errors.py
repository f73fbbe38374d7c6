"""OpenAI-style error JSON: ``{"error": {"message", "type", "param", "code"}}`` for every error on
every route (FastAPI's own 404/405/validation errors included, through ``install_handlers``)."""
from __future__ import annotations

import re

from ..errors import BudgetError, ContextOverflow, InputError, MiitaError, ModelError, StoreConflict, StoreError

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 405: "invalid_request_error", 408: "invalid_request_error", 409: "conflict_error",
         413: "invalid_request_error", 415: "invalid_request_error", 421: "permission_error",
         422: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error"}
_TAG = re.compile(r"str|int|float|bool|dict|none|constrained-[a-z]+|[a-z_-]+\[.*\]")
# one message for a field whose schema is a union or a pattern (pydantic's would list each branch)
FIELD_RULES = {"max_tokens": "must be >= 1 (or -1 or null for the server's default)",
               "max_completion_tokens": "must be >= 1 (or -1 or null for the server's default)",
               "prompt": "one string with some non-blank text (or a list of exactly one) is supported",
               "budget": "not a budget: use e.g. 4096, 64KiB, 1.5MB, 1% or none (sizes of at least one byte, "
                         "shares above 0%)"}
MAX_ECHO = 64  # characters of client input an error message may quote


def bounded(text, limit: int = MAX_ECHO) -> str:
    """``repr`` of client input, cut to ``limit`` characters: an error never echoes unbounded input
    (and never a lone surrogate, which no JSON encoder downstream may accept)."""
    s = str(text).encode("utf-8", "backslashreplace").decode("utf-8")
    return repr(s if len(s) <= limit else s[:limit] + "…")


# an absolute POSIX path (not a URL path: no "//" or scheme before it), up to a quote, space or bracket
_ABS_PATH = re.compile(r"(?<![\w.:/~-])(?:/[^\s'\"/:,;()\[\]{}<>]+)+/?")


def scrub_paths(text: str, names: dict[str, str]) -> str:
    """``text`` without the server's absolute paths: each path in ``names`` (longest first) becomes
    its public name (a memory directory -> the memory's name), then any other absolute path becomes
    its last component. A library error names the directory it failed on; a client knows the
    memory by name, and the server's file system layout is none of its business."""
    for path in sorted(names, key=len, reverse=True):
        if path and path != "/":
            text = text.replace(path, names[path])
    return _ABS_PATH.sub(lambda m: m.group(0).rstrip("/").rsplit("/", 1)[-1] or "/", text)


def bounded_list(names, limit: int = 8) -> str:
    names = list(names)
    head = ", ".join(names[:limit])
    return (head or "none") + (f" and {len(names) - limit} more" if len(names) > limit else "")


class APIError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}


def from_miita(exc: MiitaError) -> APIError:
    """A library error (one line, no traceback) as an API error."""
    msg = str(exc).splitlines()[0][:500] if str(exc) else type(exc).__name__
    if isinstance(exc, BudgetError):
        return APIError(422, msg, "budget_exceeded")
    if isinstance(exc, InputError):
        return APIError(400, msg, "invalid_input")
    if isinstance(exc, StoreError):
        return APIError(409 if isinstance(exc, StoreConflict) else 500, msg, "memory_store")
    if isinstance(exc, ContextOverflow):
        return APIError(400, msg, "context_length_exceeded")
    if isinstance(exc, ModelError):
        return APIError(500, msg, "model_error")
    return APIError(500, msg, "internal_error")


def as_api_error(exc: BaseException) -> APIError:
    """Any exception as the error a client sees (a 500 names the exception's type, no traceback)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, MiitaError):
        return from_miita(exc)
    first = str(exc).splitlines()[0][:200] if str(exc) else ""
    return APIError(500, f"internal error: {type(exc).__name__}: {bounded(first, 200)}", "internal_error")


def param_path(loc) -> str | None:
    """pydantic's error location as a JSON path: ``("messages", 0, "role")`` -> ``messages[0].role``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part not in ("body", "list", "object") and not _TAG.fullmatch(str(part)):
            out += ("." if out else "") + str(part)  # (the body, and pydantic's union branch tags)
    return out or None


def validation_error(errors: list[dict]) -> APIError:
    """FastAPI's RequestValidationError: malformed JSON is 400, a wrong schema 422. The teach body
    given as a bare list (pydantic's tag "list") is named ``examples``, as in its object form."""
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return APIError(400, "malformed JSON body", "json_invalid")
    loc = list(first.get("loc", ()))
    param = param_path(loc)
    if loc[:2] == ["body", "list"]:
        param = "examples" + (param or "")
    msg = str(first.get("msg", "invalid value"))[:200]
    rule = FIELD_RULES.get(re.sub(r"(\[\d+\])+$", "", (param or "").rsplit(".", 1)[-1]))
    if rule and first.get("type") != "missing":
        msg = rule
    return APIError(422, f"{param or 'body'}: {msg}", first.get("type"), param)
