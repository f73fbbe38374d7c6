"""``create_app()``: the FastAPI application, assembled from one router per concern (chat and
completions, memories, models, the page), in the style of llama-cpp-python's server. Endpoints:
docs/serving.md."""
from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from ..errors import MiitaError
from . import routes_chat, routes_memories, routes_models, routes_page
from .errors import APIError, as_api_error, validation_error
from .guard import Guard
from .memories import Registry
from .settings import Settings

HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 400: "bad_request"}


def _json(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def install_handlers(app: FastAPI) -> None:
    """Every error, FastAPI's and Starlette's own included, as OpenAI-style JSON; never a traceback."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        return _json(validation_error(list(exc.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, exc: StarletteHTTPException):
        msg = {404: f"no route {request.method} {request.url.path[:100]}",
               405: f"method {request.method} not allowed on {request.url.path[:100]}"}.get(exc.status_code,
                                                                                            str(exc.detail)[:200])
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:  # Starlette names the first matching route's methods only
            headers["Allow"] = ", ".join(allowed_methods(request))
        return JSONResponse(APIError(exc.status_code, msg, HTTP_CODES.get(exc.status_code, "http_error")).body(),
                            status_code=exc.status_code, headers=headers or None)

    async def _known(request, exc: Exception):
        return _json(as_api_error(exc))

    app.add_exception_handler(APIError, _known)
    app.add_exception_handler(MiitaError, _known)
    # anything else is a bug: a 500 in the same shape (Starlette still logs its traceback)
    app.add_exception_handler(Exception, _known)


METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(request) -> list[str]:
    """Every method some route serves at the request's path (``GET, POST`` for ``/v1/memories``):
    the ``Allow`` of a 405, which must list the methods the schema declares for the path, not only
    those of the first route whose path matched. HEAD is left out where FastAPI does not serve it."""
    out = []
    for method in METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] == Match.FULL for route in request.app.router.routes):
            out.append(method)
    return sorted(out)


def create_app(settings: Settings | None = None, registry: Registry | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app):
        app.state.registry = registry or Registry(settings)
        try:
            yield
        finally:
            r = app.state.registry
            r.begin_shutdown()
            await r.jobs.stop_all()  # each ends at its next batch boundary, committing nothing
            r.close()

    # No /docs or /redoc: FastAPI's pages load Swagger UI and ReDoc from a CDN, and this server is
    # meant to work offline and never make a browser fetch from elsewhere. The schema is /openapi.json.
    app = FastAPI(title="miita-edge", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.settings = settings
    if settings.allow_origins:  # pages on these origins may read answers (CORS); every other is refused
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(settings.allow_origins), allow_methods=["*"],
                           allow_headers=["*"])
    app.add_middleware(Guard, settings=settings)  # outermost: runs first
    install_handlers(app)
    for mod in (routes_page, routes_models, routes_chat, routes_memories):
        app.include_router(mod.router)
    return app
