"""miita-edge: Memory-Induced Inference-Time Adaptation for small GGUF models on CPUs.

Importing the package checks that the native extension was built against the
ggml that llama-cpp-python loads (``abi.check_abi``); a mismatch raises
``AbiError`` with the command that fixes it.
"""
from .runtime.abi import check_abi as _check_abi

ABI = _check_abi()

from .runtime.engine import Engine, EngineConfig  # noqa: E402
from .memory.bank import BankConfig, MemoryBank, Prototype  # noqa: E402
from .miita import Answer, IngestReport, Miita, Preset, get_preset  # noqa: E402
from .method.retrieval import Retrieved, RetrievalConfig  # noqa: E402
from .streams import Example  # noqa: E402

__version__ = "0.1.0"
__all__ = ["Miita", "Answer", "IngestReport", "Preset", "get_preset", "Engine", "EngineConfig", "MemoryBank",
           "BankConfig", "Prototype", "Retrieved", "RetrievalConfig", "Example", "ABI"]
