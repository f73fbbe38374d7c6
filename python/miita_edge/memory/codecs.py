"""Storage precisions for vectors in the memory (directions and keys).

Every codec is idempotent on its own output: ``encode(decode(encode(x)))``
gives the same bytes as ``encode(x)``. The memory keeps the *decoded* values
in RAM, so all similarity math sees exactly what is on disk, and re-encoding
at each commit never drifts.

- ``float32``: 4·H bytes; ``float16``: 2·H bytes;
- ``int8``: H bytes + a float32 scale per vector (max-abs / 127);
- ``bit``: H/8 bytes, the sign of each component (keys only: a centred key's
  signs keep its direction well enough for cosine ranking; decoded as ±1).
"""
from __future__ import annotations

import numpy as np

DIR_PRECISIONS = ("float32", "float16", "int8")
KEY_PRECISIONS = ("float32", "float16", "int8", "bit")


def _rows(x: np.ndarray) -> np.ndarray:
    """As an (n, H) float32 matrix; a 2-D input keeps its shape (reshape(0, -1) fails on (0, H))."""
    x = np.asarray(x, np.float32)
    return x if x.ndim == 2 else x.reshape(len(x), -1)


def encode(x: np.ndarray, precision: str) -> dict[str, np.ndarray]:
    """(n, H) float -> the arrays that persist it ('data' and, for int8, 'scale')."""
    x = _rows(x)
    if precision == "float32":
        return {"data": x.astype(np.float32)}
    if precision == "float16":
        return {"data": x.astype(np.float16)}
    if precision == "int8":
        amax = np.abs(x).max(axis=1) if x.size else np.zeros(len(x), np.float32)
        scale = (amax / 127.0).astype(np.float32)
        safe = np.where(scale > 0, scale, 1.0)
        q = np.clip(np.rint(x / safe[:, None]), -127, 127).astype(np.int8)
        return {"data": q, "scale": scale}
    if precision == "bit":
        return {"data": np.packbits(x >= 0, axis=1)}
    raise ValueError(f"unknown precision {precision!r}")


#: The dtype each precision is stored as. A store accepts any valid array (a forged file with a
#: recomputed checksum is valid), so readers check this before decoding: int16 "bits" of the right
#: shape crashed the 1-bit scan kernel (the corruption campaign, docs/reliability.md).
STORED_DTYPE = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "int8": np.dtype(np.int8),
                "bit": np.dtype(np.uint8)}


def check_stored(name: str, data: np.ndarray, precision: str) -> None:
    """Raise ValueError naming ``name`` unless ``data`` has the dtype ``precision`` is stored as."""
    want = STORED_DTYPE[precision]
    if np.asarray(data).dtype != want:
        raise ValueError(f"{name} array has dtype {np.asarray(data).dtype}, expected {want} ({precision} values)")


def decode(arrays: dict[str, np.ndarray], precision: str, n_embd: int) -> np.ndarray:
    data = np.asarray(arrays["data"])
    if precision in ("float32", "float16"):
        return data.astype(np.float32).reshape(len(data), n_embd)
    if precision == "int8":
        return data.astype(np.float32) * np.asarray(arrays["scale"], np.float32)[:, None]
    if precision == "bit":
        bits = np.unpackbits(data, axis=1, count=n_embd)
        return bits.astype(np.float32) * 2.0 - 1.0
    raise ValueError(f"unknown precision {precision!r}")


def roundtrip(x: np.ndarray, precision: str) -> np.ndarray:
    """What a vector becomes once stored: used so RAM mirrors disk exactly."""
    x = _rows(x)
    return decode(encode(x, precision), precision, x.shape[1])


def bytes_per_vector(precision: str, n_embd: int) -> int:
    return {"float32": 4 * n_embd, "float16": 2 * n_embd, "int8": n_embd + 4,
            "bit": (n_embd + 7) // 8}[precision]
