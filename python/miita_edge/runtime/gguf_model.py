"""What we need to know about a GGUF file before llama.cpp touches it.

We read the header ourselves (with the ``gguf`` package) for three reasons:
a bad path must fail with one line instead of a llama.cpp crash; architectures
that soft-cap their logits must be refused (then W·δ is no longer the logit
shift, DESIGN.md §3); and the LM-head kernels read the quantized LM-head tensor
in place from the mapped file, so we need its offset, type and shape.
"""
from __future__ import annotations

import hashlib
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from ..errors import ModelError

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class LMHead:
    """The LM-head matrix as it lies in the GGUF: n_vocab rows of n_embd values."""

    name: str  # "output.weight" or the tied "token_embd.weight"
    ggml_type: int  # ggml_type enum value (e.g. 8 = Q8_0)
    n_vocab: int
    n_embd: int
    offset: int  # absolute byte offset of the tensor data in the file
    n_bytes: int

    @property
    def row_bytes(self) -> int:
        return self.n_bytes // self.n_vocab


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    arch: str
    n_embd: int
    n_layer: int
    n_vocab: int
    lm_head: LMHead
    logit_softcap: float | None
    file_size: int
    logit_scale: float | None = None  # {arch}.logit_scale as stored (granite divides by it, command-r multiplies)
    tensor_names: frozenset = frozenset()

    @property
    def logit_mult(self) -> float:
        """logits = logit_mult * W h: the factor llama.cpp's graph applies after the LM head."""
        return logit_multiplier(self.arch, self.logit_scale)

    def map_lm_head(self) -> np.ndarray:
        """Map the LM-head bytes read-only (no copy; pages come from the OS cache)."""
        h = self.lm_head
        return np.memmap(self.path, dtype=np.uint8, mode="r", offset=h.offset, shape=(h.n_bytes,))


# Where llama.cpp scales the LM head's output by {arch}.logit_scale (src/models/*.cpp):
# granite-family graphs divide by it, command-r/cohere2 multiply by it.
LOGIT_SCALE_DIVIDES = frozenset({"granite", "granitemoe", "granitehybrid"})
LOGIT_SCALE_MULTIPLIES = frozenset({"command-r", "cohere2"})


def logit_multiplier(arch: str, logit_scale: float | None) -> float:
    if not logit_scale:
        return 1.0
    if arch in LOGIT_SCALE_DIVIDES:
        return 1.0 / float(logit_scale)
    if arch in LOGIT_SCALE_MULTIPLIES:
        return float(logit_scale)
    return 1.0  # a key the graph does not read (the self-test of check-model would show otherwise)


_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Header:
    """Minimal GGUF header reader: metadata scalars and tensor infos.

    gguf-py's GGUFReader materialises every array (262k vocabulary strings
    for Gemma-3), which takes ~9 s; we only skip over them.
    """

    def __init__(self, path: Path):
        with open(path, "rb") as fh:
            self.buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        self.pos = 0
        self.fields: dict[str, object] = {}
        self.tensors: list[tuple[str, list[int], int, int]] = []
        self.pos = 4
        magic, version = self.buf[:4], self._u(4, "<I")
        if magic != GGUF_MAGIC or version not in (2, 3):
            raise ValueError(f"unsupported GGUF version {version}")
        n_tensors, n_kv = self._u(8, "<Q"), self._u(8, "<Q")
        for _ in range(n_kv):
            key = self._str()
            self.fields[key] = self._value(self._u(4, "<I"))
        for _ in range(n_tensors):
            name = self._str()
            n_dims = self._u(4, "<I")
            dims = [self._u(8, "<Q") for _ in range(n_dims)]
            ttype, off = self._u(4, "<I"), self._u(8, "<Q")
            self.tensors.append((name, dims, ttype, off))
        align = int(self.fields.get("general.alignment", 32))
        self.data_start = (self.pos + align - 1) // align * align
        self.buf.close()

    def _u(self, size: int, fmt: str):
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v

    def _str(self) -> str:
        n = self._u(8, "<Q")
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def _value(self, vtype: int):
        if vtype == _STRING:
            return self._str()
        if vtype == _ARRAY:
            etype, n = self._u(4, "<I"), self._u(8, "<Q")
            if etype in _SCALAR:
                self.pos += n * struct.calcsize(_SCALAR[etype])
            else:
                for _ in range(n):
                    self._value(etype)
            return None  # arrays are skipped: nothing here needs them
        if vtype not in _SCALAR:
            raise ValueError(f"unknown GGUF value type {vtype}")
        return self._u(struct.calcsize(_SCALAR[vtype]), _SCALAR[vtype])


def inspect_gguf(path: str | os.PathLike) -> ModelInfo:
    """Validate a GGUF and return its facts; every failure is a one-line ModelError."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelError(f"model file not found: {p}")
    if p.is_dir():
        raise ModelError(f"model path is a directory, not a GGUF file: {p}")
    try:
        with open(p, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelError(f"cannot read model file {p}: {exc.strerror}") from None
    if magic != GGUF_MAGIC:
        raise ModelError(f"not a GGUF file (bad magic {magic!r}): {p}")
    try:
        reader = _Header(p)
    except Exception as exc:  # truncated or malformed header
        raise ModelError(f"cannot parse GGUF {p}: {type(exc).__name__}: {exc}".splitlines()[0]) from None

    fields = reader.fields
    arch = fields.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelError(f"GGUF has no general.architecture: {p}")
    n_embd = fields.get(f"{arch}.embedding_length")
    n_layer = fields.get(f"{arch}.block_count")
    if not isinstance(n_embd, int) or not isinstance(n_layer, int):
        raise ModelError(f"GGUF lacks {arch}.embedding_length/block_count: {p}")
    softcap = fields.get(f"{arch}.final_logit_softcapping")
    lscale = fields.get(f"{arch}.logit_scale")

    tensors = {t[0]: t for t in reader.tensors}
    head_t = tensors.get("output.weight") or tensors.get("token_embd.weight")
    if head_t is None:
        raise ModelError(f"GGUF has neither output.weight nor token_embd.weight: {p}")
    name, ne, ttype, rel_off = head_t  # ggml order: ne[0] = n_embd, ne[1] = n_vocab
    if len(ne) != 2 or ne[0] != n_embd:
        raise ModelError(f"unexpected LM-head shape {ne} for n_embd={n_embd}: {p}")
    size = p.stat().st_size

    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
    except (ValueError, KeyError):
        raise ModelError(f"LM head has unknown ggml type {ttype}: {p}") from None
    offset = reader.data_start + rel_off
    n_bytes = ne[0] * ne[1] // block * type_size
    if offset + n_bytes > size:
        raise ModelError(f"GGUF is truncated (LM head ends past the file end): {p}")
    head = LMHead(name, ttype, ne[1], ne[0], offset, n_bytes)
    return ModelInfo(
        path=p,
        arch=arch,
        n_embd=n_embd,
        n_layer=n_layer,
        n_vocab=ne[1],
        lm_head=head,
        logit_softcap=float(softcap) if isinstance(softcap, (int, float)) and softcap > 0 else None,
        file_size=size,
        logit_scale=float(lscale) if isinstance(lscale, (int, float)) and lscale > 0 else None,
        tensor_names=frozenset(tensors),
    )


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """sha256 of a file, cached next to nothing: callers cache it per (path, size, mtime)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()
