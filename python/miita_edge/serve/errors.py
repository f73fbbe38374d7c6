"""OpenAI-style error JSON: ``{"error": {"message", "type", "param", "code"}}`` with its status."""
from __future__ import annotations

from ..errors import BudgetError, ContextOverflow, InputError, MiitaError, ModelError, StoreConflict, StoreError

TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
         409: "conflict_error", 413: "invalid_request_error", 422: "invalid_request_error",
         500: "server_error", 503: "server_error"}


class APIError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}


def from_miita(exc: MiitaError) -> APIError:
    """A library error (one line, no traceback) as an API error."""
    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
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


def validation_error(errors: list[dict]) -> APIError:
    """FastAPI's RequestValidationError: malformed JSON is 400, a wrong schema 422."""
    first = errors[0] if errors else {}
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if first.get("type") == "json_invalid":
        return APIError(400, f"malformed JSON body: {first.get('msg', '')}", "json_invalid")
    param = ".".join(loc) or None
    return APIError(422, f"{param or 'body'}: {first.get('msg', 'invalid value')}", first.get("type"), param)
