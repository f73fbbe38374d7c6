"""``GET /``: the page (no key needed to load it; its calls carry the key typed into it)."""
from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from .page import PAGE

router = APIRouter()


@router.get("/", response_class=HTMLResponse)
async def page():
    return HTMLResponse(PAGE, headers={"X-Frame-Options": "DENY", "Content-Security-Policy": "frame-ancestors 'none'",
                                       "Referrer-Policy": "no-referrer"})
