"""A lossless Q8_0 twin of a GGUF model, for fast key extraction.

Most of Gemma-3-270M Q4_K_M's layer weights are Q5_0 (``attn_q/k``, ``ffn_gate/up``). A Q5_0 block
(an f16 scale ``d`` and 32 integers in [-16, 15] packed into 5 bits) is exactly a Q8_0 block with
the same ``d`` and the same integers as int8: the same weights, without the bit unpacking that
llama.cpp's CPU kernels redo on every tile. The gain is measured with several prompts per
decode (docs/benchmarks.md), so the twin is used only by the opt-in fast ingest, whose keys are
within rounding of one-by-one extraction anyway. A twin may also be cut after the deepest key layer (``layers``): when that layer's key is
its last row, llama.cpp then computes the layer's feed-forward half for each prompt's last row
only (it keeps only output rows in a model's last layer), and nothing past it is mapped.

The twin is derived, never stored with a memory: it is written once per model (by its sha256) to
the user cache directory, atomically (a temporary file renamed into place), and a memory's model
fingerprint stays the original's. Every tensor kept that is not Q5_0, and every metadata field but
the layer count of a cut twin, is copied unchanged.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import gguf
import numpy as np

from ..errors import ModelError
from .fingerprint import cache_dir, model_sha256

__all__ = ["q5_0_as_q8_0", "copy_gguf", "write_q8_twin", "q8_twin_path"]

_Q5_0_BLOCK = 22  # bytes: f16 d, u32 high bits, 16 bytes of low nibbles (32 weights)
_Q8_0_BLOCK = 34  # bytes: f16 d, 32 int8


def q5_0_as_q8_0(raw: np.ndarray) -> np.ndarray:
    """Q5_0 blocks as Q8_0 blocks holding the same weights: uint8 (n * 22,) -> uint8 (n * 34,).

    ggml's layout: weight j < 16 is the low nibble of ``qs[j]``, weight j >= 16 the high nibble of
    ``qs[j - 16]``; bit j of ``qh`` is weight j's fifth bit; the value is ``d * (q - 16)``."""
    b = np.ascontiguousarray(raw, np.uint8).reshape(-1, _Q5_0_BLOCK)
    qh = b[:, 2:6].copy().view("<u4").reshape(-1)
    qs = b[:, 6:22]
    lo, hi = (qs & 0x0F).astype(np.int16), (qs >> 4).astype(np.int16)
    high = ((qh[:, None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int16) << 4
    q = (np.concatenate([lo, hi], axis=1) | high) - 16
    return np.concatenate([b[:, :2], q.astype(np.int8).view(np.uint8)], axis=1).reshape(-1)


def copy_gguf(src: str | os.PathLike, dst: str | os.PathLike, *, q5_0_to_q8_0: bool = True,
              layers: int | None = None, only_if_q5_0: bool = False) -> int:
    """Copy the GGUF ``src`` to ``dst``, every metadata field and tensor, Q5_0 tensors re-encoded as
    Q8_0 when ``q5_0_to_q8_0``; ``layers``: only the first ``layers`` layers, ``block_count`` set
    to it. Returns how many tensors were re-encoded; with ``only_if_q5_0`` and none to re-encode,
    0 and nothing written. Reads the metadata once (a 262,144-entry vocabulary takes gguf-py
    seconds). Not atomic by itself."""
    Q5 = gguf.GGMLQuantizationType.Q5_0
    r = gguf.GGUFReader(str(src))
    field = r.fields["general.architecture"]
    arch = bytes(field.parts[field.data[0]]).decode()
    blocks = f"{arch}.block_count"
    if layers is not None:
        n_layer = int(r.fields[blocks].parts[r.fields[blocks].data[0]][0])
        if not 1 <= layers <= n_layer:
            raise ValueError(f"cannot keep {layers} layers of {n_layer}")
    tensors = [t for t in r.tensors
               if layers is None or not (t.name.startswith("blk.") and int(t.name.split(".")[1]) >= layers)]
    if only_if_q5_0 and not any(t.tensor_type == Q5 for t in tensors):
        return 0
    w = gguf.GGUFWriter(str(dst), arch)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            sub = f.types[-1]
            val = ([bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data]
                   if sub == gguf.GGUFValueType.STRING else [f.parts[i].tolist()[0] for i in f.data])
            w.add_key_value(f.name, val, t, sub_type=sub)
        elif t == gguf.GGUFValueType.STRING:
            w.add_key_value(f.name, bytes(f.parts[f.data[0]]).decode("utf-8", "surrogateescape"), t)
        else:
            w.add_key_value(f.name, layers if f.name == blocks and layers is not None
                            else f.parts[f.data[0]].tolist()[0], t)
    n = 0
    for t in tensors:
        data = np.asarray(t.data)
        if q5_0_to_q8_0 and t.tensor_type == Q5:
            shape = [int(x) for x in reversed(t.shape)]  # rows first, as the reader gives the data
            q = q5_0_as_q8_0(data.reshape(-1).view(np.uint8))
            w.add_tensor(t.name, q.reshape(shape[:-1] + [shape[-1] // 32 * _Q8_0_BLOCK]),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            n += 1
        else:
            w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return n


def write_q8_twin(src: str | os.PathLike, dst: str | os.PathLike, layers: int | None = None) -> int:
    """Write ``src`` to ``dst`` with every Q5_0 tensor re-encoded as Q8_0 (``layers``: cut after
    that many layers); returns how many were, 0 with nothing written when there is none. Not
    atomic by itself: :func:`q8_twin_path` writes to a temporary name and renames."""
    return copy_gguf(src, dst, layers=layers, only_if_q5_0=True)


def q8_twin_path(model: str | os.PathLike, directory: str | os.PathLike | None = None,
                 quiet: bool = False, layers: int | None = None) -> Path | None:
    """The Q8_0 twin of ``model``, written to ``directory`` (default: the user cache directory) on
    first use; None when the model has no Q5_0 tensor (the original is then as fast).

    ``layers``: keep only the first ``layers`` layers (``block_count`` set to it): a copy cut after
    the deepest key layer, whose rows beyond each prompt's last llama.cpp then skips in that layer
    (``EngineConfig.key_cut``). The name carries the model's sha256 (and the cut), so a changed
    model file gets a new twin; the file appears only complete (renamed from a temporary name), so a
    crash mid-write leaves no twin to trust."""
    model = Path(model)
    d = Path(directory) if directory is not None else cache_dir() / "twins"
    stem = model_sha256(model)[:32]
    dst = d / (f"{stem}-q8_0.gguf" if layers is None else f"{stem}-q8_0-{int(layers)}-layers.gguf")
    none = d / f"{stem}-no-q5_0"
    if dst.is_file():
        return dst
    if none.is_file():
        return None
    tmp = dst.with_name(f"{dst.name}.{os.getpid()}.tmp")
    try:
        d.mkdir(parents=True, exist_ok=True)
        if not quiet:
            print(f"miita-edge: making a Q8_0 twin of {model.name} for fast key extraction in {d} "
                  f"(once per model; ~10-20 s)", file=sys.stderr)
        if write_q8_twin(model, tmp, None if layers is None else int(layers)) == 0:
            none.touch()  # reading the model to find out takes seconds: remember the answer
            return None
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, dst)
    except OSError as exc:
        raise ModelError(f"cannot write the Q8_0 twin of {model.name} to {d} ({exc.strerror or exc}): free "
                         f"space there, point XDG_CACHE_HOME elsewhere, or ingest without fast keys") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return dst
