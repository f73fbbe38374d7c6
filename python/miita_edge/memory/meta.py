"""A memory's own fields in its store manifest: the compact form stored since format 2, and the
long form the code reads (which is also what format-1 memories stored).

Every stored byte counts against the memory's budget, and at 1% of Banking77 (2,390 bytes) the
long form alone was ~300 bytes. The long form, as ``expand`` returns it::

    {"format": "miita-edge-memory/2", "preset": {"name": ..., overrides...}, "template": str,
     "fingerprint": {"sha256": 64 hex digits, "arch": str, "n_embd": int, "key_layer": int},
     "budget": str, "stream_bytes": int, "examples": int, "skipped": int,
     "prototypes": int, "anchors": int, "key_whitened": bool}

The stored form (``compact``), e.g. ``{"m":2,"p":"default","t":"banking77","f":["<16 chars>",
"gemma3",640,6],"b":"1%","s":239055,"e":3075}``:

    m   memory format, 2 (a change that older readers must not misread raises it)
    p   the preset's name ("default/2" for version 2 of a named preset), or {"name": ...,
        overrides...} when it differs from the named preset
    t   template, omitted when "plain"
    f   fingerprint [sha256, arch, n_embd, key_layer], the last a list of key layers when the keys
        pool several ([..., [12, 9]]: key_layer is the first). The sha256 as unpadded base64url:
        its first 12 bytes (16 characters), as store format 3 writes it; format 2 stored all of it
        (43 characters), which is still read. The long form then holds those 96 bits as 24 hex
        digits, and a model is the memory's when its sha256 begins with them (``same_model``).
        Why 96 bits: they tell a wrong model file from the right one as surely as 256 (an
        accidental match has odds of 2^-96; the fingerprint guards against a mistake, not an
        attacker who can write the memory anyway), and the other 27 characters are 2.5% of
        Banking77's budget at 0.5%. Both lengths are read.
    b   budget, omitted when "64KiB"
    s   stream_bytes;  e  examples;  k  skipped, omitted when 0
    w   1 when the memory decided at its first ingest to whiten its keys (preset key_whitening
        "replies"), omitted otherwise; a reader that does not know it cannot know that preset
        version either, so it refuses the memory instead of misreading its keys

The omitted values are constants of this format, not the CLI's defaults (those may change).
``prototypes`` and ``anchors`` are not stored: they are the lengths of the ``counts`` and
``anchor_count`` arrays (``anchors`` where ``anchor_count`` is left out). Extensible: a later
version may add keys (readers ignore keys they do not know, so a new key must have a meaning when
absent). Pure functions, no I/O.
"""
from __future__ import annotations

import base64
import binascii
import re
from typing import Mapping

from . import store_format

FORMAT_V1 = "miita-edge-memory/1"
FORMAT_V2 = "miita-edge-memory/2"
FORMATS = (FORMAT_V1, FORMAT_V2)
MEMORY_FORMAT = 2  # the stored "m"
OMITTED = {"t": "plain", "b": "64KiB", "k": 0}
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX96 = re.compile(r"[0-9a-f]{24}")  # the 96 bits a format-3 memory keeps, as expand() gives them
#: The sha256's bytes a store of format 3 keeps (16 characters); format 2 keeps all 32 (43).
SHA_BYTES = 12
_B64_SHA = re.compile(r"[A-Za-z0-9_-]{16}|[A-Za-z0-9_-]{43}")


def compact(fields: Mapping) -> dict:
    """The stored form of a memory's long-form fields (``prototypes``/``anchors`` are dropped).
    ValueError for a fingerprint whose sha256 is not 64 lowercase hex digits."""
    fp = fields["fingerprint"]
    sha = fp.get("sha256")
    short = isinstance(sha, str) and bool(_HEX96.fullmatch(sha))
    if not isinstance(sha, str) or not (_HEX64.fullmatch(sha) or short):
        raise ValueError(f"fingerprint sha256 must be 64 lowercase hex digits (or the 24 a format-3 memory keeps), "
                         f"got {str(sha)[:70]!r}")
    kept = SHA_BYTES if store_format.FORMAT_VERSION >= 3 else 32
    if short and kept > SHA_BYTES:  # expand() of a format-3 memory, written back in format 2
        raise ValueError("fingerprint sha256 has 96 bits (a format-3 memory's); store format 2 needs all 256")
    sha = base64.urlsafe_b64encode(bytes.fromhex(fp["sha256"])[:kept]).decode("ascii").rstrip("=")
    preset = dict(fields["preset"])
    if set(preset) == {"name"}:
        p = preset["name"]
    elif set(preset) == {"name", "version"} and isinstance(preset["version"], int) and "/" not in preset["name"]:
        p = f"{preset['name']}/{preset['version']}"
    else:
        p = preset
    layers = fp.get("key_layers")
    out = {"m": MEMORY_FORMAT, "p": p,
           "t": fields["template"], "f": [sha, fp["arch"], fp["n_embd"], list(layers) if layers else fp["key_layer"]],
           "b": fields["budget"], "s": fields["stream_bytes"], "e": fields["examples"], "k": fields["skipped"]}
    if fields.get("key_whitened"):
        out["w"] = 1
    for key, value in OMITTED.items():
        if out[key] == value and type(out[key]) is type(value):
            del out[key]
    return out


def expand(stored, arrays: Mapping) -> dict:
    """The long form of a stored memory manifest, compact (store formats 2 and 3) or long (format 1).

    Lenient on purpose: a field it cannot decode comes back as None (or the format as whatever
    was there), and the check names it (``memory.manifest.check_fields``)."""
    if not isinstance(stored, dict):
        return {"format": None}
    if "m" not in stored:
        return dict(stored)  # format 1 stored the long form (or this is not a memory at all)
    m = stored["m"]
    if m != MEMORY_FORMAT or isinstance(m, bool):
        return {"format": m}
    p = stored.get("p")
    out = {"format": FORMAT_V2,
           "preset": _preset(p),
           "template": stored.get("t", OMITTED["t"]),
           "fingerprint": _fingerprint(stored.get("f")),
           "budget": stored.get("b", OMITTED["b"]),
           "stream_bytes": stored.get("s"),
           "examples": stored.get("e"),
           "skipped": stored.get("k", OMITTED["k"]),
           "prototypes": _length(arrays, "counts"),
           "anchors": _length(arrays, "anchor_count" if "anchor_count" in arrays else "anchors"),
           "key_whitened": _flag(stored.get("w", 0))}
    return out


def _flag(w):
    """``w`` as stored: 1 -> True, absent (0) -> False; anything else is passed on for the check to name."""
    if w == 1 and not isinstance(w, bool):
        return True
    if w == 0 and not isinstance(w, bool):
        return False
    return w


def _preset(p):
    if not isinstance(p, str):
        return p
    name, sep, version = p.partition("/")
    if sep and version.isdigit():
        return {"name": name, "version": int(version)}
    return {"name": p}


def _fingerprint(f) -> dict | None:
    if not (isinstance(f, list) and len(f) == 4 and isinstance(f[0], str) and _B64_SHA.fullmatch(f[0])):
        return None
    try:
        raw = base64.urlsafe_b64decode(f[0] + "=" * (-len(f[0]) % 4))
    except (binascii.Error, ValueError):
        return None
    if isinstance(f[3], list):  # several key layers: the first is key_layer
        if not f[3]:
            return None
        return {"sha256": raw.hex(), "arch": f[1], "n_embd": f[2], "key_layer": f[3][0], "key_layers": f[3]}
    return {"sha256": raw.hex(), "arch": f[1], "n_embd": f[2], "key_layer": f[3]}


def same_model(stored: Mapping, model: Mapping) -> bool:
    """Whether a memory's stored fingerprint (long form) is the model's: every field equal, and the
    model's sha256 (64 hex digits) begins with the stored one (all 64, or the first 24 that
    ``compact`` keeps)."""
    sha = stored.get("sha256")
    if not (isinstance(sha, str) and len(sha) in (2 * SHA_BYTES, 64) and model["sha256"].startswith(sha)):
        return False
    return {k: v for k, v in stored.items() if k != "sha256"} == {k: v for k, v in model.items() if k != "sha256"}


def _length(arrays: Mapping, name: str) -> int | None:
    a = arrays.get(name)
    return int(a.shape[0]) if a is not None and getattr(a, "ndim", 0) >= 1 else None
