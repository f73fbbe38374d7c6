"""Import-time check that the native extension matches the loaded llama.cpp.

The extension reads ``struct ggml_tensor`` fields inside the eval callback, so
it must be compiled against the same ggml headers as the libraries that
llama-cpp-python loads. A mismatch would not fail loudly: it would read the
wrong bytes. We compare three facts and refuse to run on any difference.
"""
from __future__ import annotations

import ctypes
import os

from ..errors import AbiError

PINNED_LLAMA_CPP_PYTHON = "0.3.36"
PINNED_GGML_COMMIT = "0c1e570"  # llama.cpp commit vendored by llama-cpp-python 0.3.36
GGML_OBJECT_SIZE = 32  # sizeof(struct ggml_object) on 64-bit targets (ggml.c)

_REINSTALL = (
    f"reinstall with: pip install 'llama-cpp-python=={PINNED_LLAMA_CPP_PYTHON}' && "
    "pip install --force-reinstall --no-deps miita-edge"
)


def ggml_library() -> ctypes.CDLL:
    """The libggml-base.so that llama_cpp itself loaded (same path, so the same handle)."""
    import llama_cpp  # here: the package imports abi first, and a missing llama.cpp is this check's error

    path = os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so")
    lib = ctypes.CDLL(path)
    lib.ggml_tensor_overhead.restype = ctypes.c_size_t
    lib.ggml_commit.restype = ctypes.c_char_p
    lib.ggml_version.restype = ctypes.c_char_p
    return lib


def check_abi(native=None, llama_cpp_version: str | None = None, lib=None) -> dict:
    """Raise AbiError unless the extension and the loaded ggml agree; return the facts.

    The arguments exist so tests can inject a mismatch without a second build.
    """
    try:
        import llama_cpp
    except ImportError as exc:  # pragma: no cover - dependency missing entirely
        raise AbiError(f"llama-cpp-python is not importable ({exc}); {_REINSTALL}") from None
    if native is None:
        try:
            from ..native import ext as native  # here, not at the top: a missing build is this check's error
        except ImportError as exc:
            raise AbiError(f"miita_edge native extension failed to load ({exc}); {_REINSTALL}") from None
    version = llama_cpp_version or llama_cpp.__version__
    lib = lib or ggml_library()
    overhead = int(lib.ggml_tensor_overhead())
    commit = (lib.ggml_commit() or b"").decode()
    compiled = int(native.compiled_tensor_size())
    facts = {"llama_cpp_python": version, "ggml_commit": commit, "ggml_version": lib.ggml_version().decode(),
             "ggml_tensor_overhead": overhead, "compiled_tensor_size": compiled}
    if version != PINNED_LLAMA_CPP_PYTHON:
        raise AbiError(f"llama-cpp-python {version} is loaded but miita-edge needs {PINNED_LLAMA_CPP_PYTHON}; {_REINSTALL}")
    if overhead != compiled + GGML_OBJECT_SIZE:
        raise AbiError(
            f"ggml ABI mismatch: loaded ggml_tensor_overhead()={overhead}, extension compiled for "
            f"{compiled + GGML_OBJECT_SIZE}; {_REINSTALL}")
    if not commit.startswith(PINNED_GGML_COMMIT):
        raise AbiError(f"ggml commit {commit!r} is loaded but miita-edge was built for {PINNED_GGML_COMMIT}; {_REINSTALL}")
    return facts
