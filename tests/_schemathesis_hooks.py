"""Schemathesis hooks for tests/test_serve_schemathesis.py (loaded through SCHEMATHESIS_HOOKS).

A few rejections of schema-valid requests are rules no OpenAPI schema can state: the conversation
must end in a user message with text, the prompt and ``max_tokens`` must fit the context, a teach
must fit the memory's budget, ``top_logprobs`` needs ``logprobs``, logprobs cannot be streamed,
and a paper-preset memory cannot forget. The run lets the operations answer those with 400/422
(``positive_data_acceptance`` is widened for them in the config) and this check makes sure that
every such rejection of a schema-valid request is one of these rules, by its error code and param,
and nothing else."""
from __future__ import annotations

import json

import schemathesis

ALLOWED = {  # operation -> {(status, code, param or None)}
    "POST /v1/chat/completions": {(400, "invalid_input", None), (400, "context_length_exceeded", "max_tokens"),
                                  (400, "context_length_exceeded", None),
                                  (400, "unsupported_parameter", "top_logprobs"),
                                  (400, "unsupported_parameter", "logprobs")},
    "POST /v1/completions": {(400, "context_length_exceeded", "max_tokens"), (400, "context_length_exceeded", None),
                             (400, "unsupported_parameter", "logprobs")},
    "POST /v1/memories/{name}/examples": {(422, "budget_exceeded", None), (400, "context_length_exceeded", None)},
    "DELETE /v1/memories/{name}/examples": {(400, "invalid_input", None)},
}


@schemathesis.check
def only_unschemable_rejections(ctx, response, case):
    """A schema-valid request rejected with 400/422 names one of the rules in ``ALLOWED``."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code not in (400, 422):
        return None
    label = f"{case.method.upper()} {case.operation.path}"
    try:
        err = json.loads(response.content)["error"]
    except (ValueError, KeyError, TypeError):
        raise AssertionError(f"{label}: a {response.status_code} without an OpenAI error body") from None
    key = (response.status_code, err.get("code"), err.get("param"))
    if key not in ALLOWED.get(label, set()):
        raise AssertionError(f"{label}: schema-valid request rejected: {response.status_code} {err.get('code')} "
                             f"{err.get('param')}: {str(err.get('message'))[:200]}")
    return None
