"""The centring vector of the default preset's keys (a calibration mean).

It depends only on the model, the template and the key settings, never on the training
stream, so — like the LM head — it is derived again whenever a memory opens rather than stored
in the memory, and it does not count against the memory's byte budget.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..runtime.engine import Engine
from .templates import Template

__all__ = ["CALIBRATION_INPUTS", "calibration_mean", "raw_key"]

# key mean, the centring vector is the mean key of these through the template.
CALIBRATION_INPUTS = [
    "hello there", "what time is it", "the weather is nice today", "please help me with this",
    "I have a question about my order", "can you tell me more", "this is a short sentence",
    "where can I find the information", "thank you very much", "it does not work as expected",
    "how much does it cost", "I would like to change something", "is this the right place to ask",
    "my friend told me about it", "nothing happened after I tried", "could you explain that again",
]


def raw_key(engine: Engine, template: Template, x: str, skip_bos: bool) -> np.ndarray:
    """Eq. 1's pooled key of ``x`` through ``template``, before any centring."""
    toks = engine.tokenize(template.render_prompt(x))
    return engine.query(toks, skip_bos_in_key=skip_bos).key


def calibration_mean(engine: Engine, template: Template, skip_bos: bool, fingerprint: dict) -> np.ndarray:
    """The mean key of CALIBRATION_INPUTS through ``template`` (float32, shape (n_embd,)).

    Cached per (model sha256, template, key layer, BOS rule) in the user cache directory,
    because computing it costs 16 prompt passes; a cache file that cannot be read or has the
    wrong shape is recomputed, and a cache that cannot be written is simply skipped.
    """
    tag = f"{fingerprint['sha256'][:16]}-{template.name}-L{fingerprint['key_layer']}-bos{int(not skip_bos)}"
    path = _cache_dir() / f"keymean-{tag}.npy"
    try:
        mean = np.load(path)
        if mean.shape == (engine.n_embd,):
            return mean.astype(np.float32)
    except (OSError, ValueError):
        pass
    mean = np.mean([raw_key(engine, template, x, skip_bos) for x in CALIBRATION_INPUTS], axis=0).astype(np.float32)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
        np.save(tmp, mean)
        os.replace(tmp, path)
    except OSError:
        pass
    return mean


def _cache_dir() -> Path:
    try:
        from platformdirs import user_cache_dir

        return Path(user_cache_dir("miita-edge", appauthor=False))
    except ImportError:  # pragma: no cover
        return Path.home() / ".cache" / "miita-edge"
