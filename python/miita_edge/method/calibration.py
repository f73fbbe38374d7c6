"""The centring vector of the default preset's keys (a calibration mean).

It depends only on the model, the template and the key settings, never on the training
stream, so — like the LM head — it is derived again whenever a memory opens rather than stored
in the memory, and it does not count against the memory's byte budget.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..runtime import key_pass
from ..runtime.engine import Engine
from ..runtime.fingerprint import cache_dir, write_cached
from ..runtime.key_pooling import key_mean
from .templates import Template

__all__ = ["CALIBRATION_INPUTS", "cached_raw_keys", "calibration_keys", "coordinate_rms", "key_order", "raw_key"]

# key mean, the centring vector is the mean key of these through the template.
CALIBRATION_INPUTS = [
    "hello there", "what time is it", "the weather is nice today", "please help me with this",
    "I have a question about my order", "can you tell me more", "this is a short sentence",
    "where can I find the information", "thank you very much", "it does not work as expected",
    "how much does it cost", "I would like to change something", "is this the right place to ask",
    "my friend told me about it", "nothing happened after I tried", "could you explain that again",
]


def raw_key(engine: Engine, template: Template, x: str, skip_bos: bool) -> np.ndarray:
    """Eq. 1's pooled key of ``x`` through ``template``, before any centring ((L·H,) for L key layers)."""
    toks = engine.tokenize(template.render_prompt(x))
    s, n = key_pass.prompt_key(engine, toks, engine.key_mask(toks, skip_bos))  # a key-only pass: only the key is needed
    return key_mean(s, n)


def calibration_keys(engine: Engine, template: Template, skip_bos: bool, fingerprint: dict) -> np.ndarray:
    """The raw keys of CALIBRATION_INPUTS through ``template`` (float32, (16, L·H) for L key layers).

    Cached per (model sha256, template, key layers, their pooling, BOS rule) in the user cache directory,
    because computing them costs 16 prompt passes; a cache file that cannot be read or has the
    wrong shape is recomputed, and a cache that cannot be written is simply skipped.
    """
    layers = fingerprint.get("key_layers") or [fingerprint["key_layer"]]
    width = engine.n_embd * len(layers)
    tag = f"{fingerprint['sha256'][:16]}-{template.name}-L{'_'.join(map(str, layers))}-bos{int(not skip_bos)}"
    if any(p != "mean" for p in engine.key_pooling):  # mean-pooled keys keep the tag they always had
        tag += "-P" + "_".join(engine.key_pooling)
    keys = cached_raw_keys(engine, template, skip_bos, list(CALIBRATION_INPUTS), _cache_dir() / f"keys-{tag}.npy")
    if keys.shape[1] != width:
        raise ValueError(f"calibration keys have {keys.shape[1]} values, expected {width} (key layers {layers})")
    return keys


def cached_raw_keys(engine: Engine, template: Template, skip_bos: bool, texts: list[str], path: Path) -> np.ndarray:
    """``raw_key`` of every text (float32, (len(texts), L·H)), read from ``path`` when a readable,
    finite file of that shape is there, else computed and written there (a write that fails is
    skipped)."""
    width = engine.n_embd * len(engine.key_layers)
    try:
        keys = np.load(path)
        if keys.shape == (len(texts), width) and np.isfinite(keys).all():
            return keys.astype(np.float32)
    except (OSError, ValueError):
        pass
    keys = np.stack([raw_key(engine, template, x, skip_bos) for x in texts]).astype(np.float32)
    write_cached(path, lambda tmp: np.save(tmp, keys))
    return keys


def key_order(keys: np.ndarray, n_parts: int, whiten: np.ndarray | None = None) -> np.ndarray:
    """The order in which a key's coordinates are kept when a tight budget narrows it:
    layer block by layer block (the first key layer first), and inside a block by the spread of the
    calibration keys after centring and per-block normalisation, highest first (ties: lower index).

    Why: a coordinate that varies more across neutral prompts carries more of what tells prompts
    apart; one centroid per Banking77 label kept 52% of the vote at 80 bits in this order and 27%
    in index order (docs/method.md). Like the centring vector it depends only on the model and the
    template, so it is derived again at open instead of being stored. ``whiten``: the memory's key
    whitening (method/key_whitening.py), applied before the spread is taken, as keys are whitened
    before they are ordered."""
    keys = np.asarray(keys, np.float64)
    x = keys - keys.mean(axis=0)
    H = x.shape[1] // n_parts
    blocks = x.reshape(len(x), n_parts, H)
    blocks = blocks / np.maximum(np.linalg.norm(blocks, axis=2, keepdims=True), 1e-12)
    if whiten is not None:
        blocks = (blocks.reshape(len(x), -1) @ np.asarray(whiten, np.float64).T).reshape(len(x), n_parts, H)
    std = blocks.std(axis=0)  # (n_parts, H)
    return np.concatenate([b * H + np.argsort(-std[b], kind="stable") for b in range(n_parts)]).astype(np.int64)


def coordinate_rms(keys: np.ndarray, mean: np.ndarray, n_parts: int, whiten: np.ndarray | None = None) -> np.ndarray:
    """Each key coordinate's root mean square over ``keys`` (raw pooled keys, the model's general
    prompts) prepared as a memory prepares them before ordering: centred on ``mean``, each layer's
    block at unit norm, whitened where the memory whitens; indexed as those coordinates (before the
    order). A balanced narrowing weighs a coordinate by it: how much a bit there moves the vote's
    score, q · b, depends on how large the query's coordinate is. Derived from the model, not stored."""
    x = np.asarray(keys, np.float64) - np.asarray(mean, np.float64)
    H = x.shape[1] // n_parts
    blocks = x.reshape(len(x), n_parts, H)
    x = (blocks / np.maximum(np.linalg.norm(blocks, axis=2, keepdims=True), 1e-12)).reshape(len(x), -1)
    if whiten is not None:
        x = x @ np.asarray(whiten, np.float64).T
    return np.sqrt((x ** 2).mean(axis=0))


def _cache_dir() -> Path:
    return cache_dir()
