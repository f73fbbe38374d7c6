"""The compiled extension (``csrc/``, pybind11), reached through this one base-layer module.

Every module that calls a kernel or the eval callback's state imports it from here at its top:
``from ..native import ext``. Importing the package already checks that the extension matches the
loaded ggml (``runtime.abi``), so a missing or mismatched build fails at import with the command
that fixes it, never midway through a call.
"""
from __future__ import annotations

from . import _native as ext

__all__ = ["ext"]
