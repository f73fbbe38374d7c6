"""Run the app under uvicorn, and say when it listens.

Why a line of its own: the server logs at warning level (no request log on a desktop), so
uvicorn prints nothing once the model is loaded and the socket is open; a user (or a script
starting Open WebUI after it) could not tell a loading server from a ready one. The line is
printed after uvicorn has bound the socket, and only then."""
from __future__ import annotations


def ready_line(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"miita-edge serve: ready on http://{shown}:{port}"


def run_server(app, registry, host: str, port: int) -> None:
    """uvicorn, with the ready line once the socket listens, told to stop the registry's work the
    moment a stop signal arrives.

    uvicorn's graceful shutdown first waits for every open request to end and only then runs the
    lifespan's shutdown; a streamed answer or a request waiting for a teach would hold it up for as
    long as they run. ``Registry.begin_shutdown`` (on the event loop, not in the signal handler, which
    may have interrupted the loop inside the worker's lock) stops answers at their next token, fails
    queued work with 503 and cancels teach jobs, so those requests end within a batch."""
    import asyncio

    import uvicorn

    class Server(uvicorn.Server):
        loop: asyncio.AbstractEventLoop | None = None

        async def serve(self, sockets=None):
            self.loop = asyncio.get_running_loop()
            await super().serve(sockets)

        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            if self.started and not self.should_exit:
                print(ready_line(host, port), flush=True)

        def handle_exit(self, sig, frame):
            if self.loop is not None and not registry.closing.is_set():
                self.loop.call_soon_threadsafe(registry.begin_shutdown)
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=10)
    Server(config).run()
