"""Schemathesis against ``miita-edge serve`` on 127.0.0.1 (a tiny GGUF): every phase (the schema's
examples, coverage of each constraint's edges, random fuzzing, stateful chains such as create ->
teach -> info), with every check, a fixed seed and a fixed number of cases per operation, so CI
sees the same run. Beyond "no 5xx", the checks hold the server to its schema: each status and
response body is the one declared (``status_code_conformance``, ``response_schema_conformance``,
``content_type_conformance``), a request the schema forbids is refused (``negative_data_rejection``),
one it allows is accepted (``positive_data_acceptance``, ST202; the few rules no schema can state
are named one by one in tests/_schemathesis_hooks.py), and a 405 lists the path's methods in
``Allow`` (``unsupported_method``, ``allow_header_conformance``, ST205)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("schemathesis")

from _serve_server import API_KEY, Server, tiny_model  # noqa: E402

MAX_EXAMPLES = 10
WIDENED = {  # the operations with rules no schema can state (tests/_schemathesis_hooks.py names them)
    "POST /v1/chat/completions": "400", "POST /v1/completions": "400",
    "POST /v1/memories/{name}/examples": "422", "DELETE /v1/memories/{name}/examples": "400"}
# checks that need what this server does not have: securitySchemes in the schema (the key is a
# server flag, not part of the schema), or several users
NOT_APPLICABLE = ("ignored_auth", "object_level_authorization")


def config() -> str:
    out = []
    for op, extra in WIDENED.items():
        out += ["[[operations]]", f'include-name = "{op}"',
                f'checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "{extra}"]',
                ""]
    return "\n".join(out)


def test_schemathesis_run(tmp_path):
    d = tmp_path
    s = Server("--model", str(tiny_model(d)), "--memory", f"m={d / 'm'}", "--memory-root", str(d / "root"),
               "--max-memories", "8", "--ctx", "512", log=d / "server.log", threads=1)
    try:
        st, _ = s.request("POST", "/v1/memories/m/examples", [{"input": "card charged twice", "output": "billing"}])
        assert st == 200
        (d / "schemathesis.toml").write_text(config())
        env = dict(os.environ, SCHEMATHESIS_HOOKS="_schemathesis_hooks",
                   PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
        cmd = [sys.executable, "-m", "schemathesis.cli", "--no-color", "--config-file", str(d / "schemathesis.toml"), "run",
               f"{s.url}/openapi.json", "--checks", "all", "--exclude-checks", ",".join(NOT_APPLICABLE),
               "--max-examples", str(MAX_EXAMPLES), "--seed", "7", "--workers", "1", "--request-timeout", "60",
               "--generation-database", "none", "-H", f"Authorization: Bearer {API_KEY}", "--warnings", "off"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=d, env=env)
    finally:
        s.stop()
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-8000:]
    assert "No issues found" in out and "Operations:" in out, out[-3000:]  # it ran, and ran them all
