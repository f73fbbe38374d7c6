"""Process-wide llama.cpp settings made before a model loads: its log routed through a filter, and
whether this CPU must avoid llama.cpp's AMX buffer type."""
from __future__ import annotations

import ctypes
import sys

import llama_cpp
from llama_cpp import _logger  # noqa: F401  installs its callback on import; ours replaces it

__all__ = ["cpu_has_amx", "install_log_filter"]

_LOG_CB = None  # the ctypes log callback must stay alive while llama.cpp may call it
_LOG_VERBOSE = [False]


def install_log_filter(verbose: bool) -> None:
    """Route llama.cpp's log through a filter: everything when verbose, else errors only.

    llama-cpp-python 0.3.x maps ggml's log levels off by one (ggml.h: DEBUG=1,
    INFO=2, WARN=3, ERROR=4, CONT=5), so with verbose off it still prints WARN
    lines on every model load; a user error must stay one line on stderr.
    """
    global _LOG_CB
    _LOG_VERBOSE[0] = bool(verbose)
    if _LOG_CB is not None:
        return
    last = [0]

    @llama_cpp.llama_log_callback
    def cb(level, text, user_data):
        if level != 5:  # GGML_LOG_LEVEL_CONT continues the previous message
            last[0] = level
        if _LOG_VERBOSE[0] or last[0] == 4:  # GGML_LOG_LEVEL_ERROR
            print(text.decode("utf-8", errors="replace"), end="", file=sys.stderr, flush=True)

    llama_cpp.llama_log_set(cb, ctypes.c_void_p(0))
    _LOG_CB = cb


def cpu_has_amx() -> bool:
    """llama.cpp's AMX extra buffer type segfaults on the first decode (DESIGN.md §3)."""
    try:
        with open("/proc/cpuinfo") as fh:
            return any("amx_tile" in line for line in fh if line.startswith("flags"))
    except OSError:
        return False
