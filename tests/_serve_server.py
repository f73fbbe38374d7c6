"""Start ``miita-edge serve`` as a subprocess on 127.0.0.1 on a free port (the serve tests)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import miita_edge

API_KEY = "test-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args: str, log: Path, threads: int = 2, api_key: str | None = API_KEY):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        env = dict(os.environ)
        # the package the tests import, whether installed or from the checkout (PYTHONPATH)
        pkg_parent = str(Path(miita_edge.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join([pkg_parent] + [p for p in [env.get("PYTHONPATH")] if p])
        cmd = [sys.executable, "-m", "miita_edge.cli", "serve", "--port", str(self.port), "--threads", str(threads),
               "--ctx", "1024", *args] + (["--api-key", api_key] if api_key else [])
        self.log = log
        self._logf = open(log, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._logf, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._logf.close()  # a server that would not start leaves no open file behind
                raise RuntimeError(f"server exited {self.proc.returncode}: {log.read_text()[-2000:]}")
            try:
                self.get("/v1/models")
                return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server did not start in 90 s: {log.read_text()[-2000:]}")

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def request(self, method: str, path: str, body=None, raw: bytes | None = None, headers: dict | None = None):
        """(status, parsed JSON) -- error statuses included, never raised."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        h = {"Content-Type": "application/json", **self.headers(), **(headers or {})}
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            with e:
                return e.code, json.loads(e.read())

    def get(self, path: str):
        return self.request("GET", path)

    def client(self):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=self.api_key or "none", max_retries=0, timeout=120)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._logf.close()
        out = self.log.read_text(errors="replace")
        assert "Traceback" not in out, out[-3000:]


def demo_rows(split: str = "train") -> list[dict]:
    from importlib.resources import files

    text = files("miita_edge.demo").joinpath("stream.jsonl").read_text()
    return [r for r in map(json.loads, text.splitlines()) if r.get("split") == split]


def tiny_model(out_dir: Path) -> Path:
    """A tiny generated GGUF (tests/tiny_gguf.py): random weights, fast to load and to answer."""
    import tiny_gguf

    return tiny_gguf.make("llama", "Q8_0", False, out_dir)


def tiny_client(tmp: Path, **settings):
    """The app in process (FastAPI's TestClient, Host 127.0.0.1) on a tiny model; a context manager."""
    from fastapi.testclient import TestClient

    from miita_edge.serve.app import create_app
    from miita_edge.serve.settings import Settings

    st = Settings(model=str(tiny_model(tmp)), **{"threads": 1, "n_ctx": 512, **settings})
    return TestClient(create_app(st), base_url="http://127.0.0.1")


def error_shape(body) -> bool:
    """OpenAI's error object, exactly."""
    return (isinstance(body, dict) and set(body) == {"error"} and set(body["error"]) == {"message", "type", "param",
                                                                                          "code"}
            and isinstance(body["error"]["message"], str) and body["error"]["message"]
            and "Traceback" not in body["error"]["message"])
