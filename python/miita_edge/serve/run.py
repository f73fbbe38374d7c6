"""Run the app under uvicorn, and say when it listens.

Why a line of its own: the server logs at warning level (no request log on a desktop), so
uvicorn prints nothing once the model is loaded and the socket is open; a user (or a script
starting Open WebUI after it) could not tell a loading server from a ready one. The line is
printed after uvicorn has bound the socket, and only then."""
from __future__ import annotations


def ready_line(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"miita-edge serve: ready on http://{shown}:{port}"


def run(app, host: str, port: int) -> None:
    """``uvicorn.run`` with the ready line once the socket listens."""
    import uvicorn

    class _Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            if self.started and not self.should_exit:
                print(ready_line(host, port), flush=True)

    _Server(uvicorn.Config(app, host=host, port=port, log_level="warning")).run()
