"""More llama.cpp contexts on one loaded model, and the model's twin for keys.

A sibling is a second context on an engine's loaded model, with its own callback state, batch and
KV cache: extraction on several threads without loading the weights twice. The Q8_0 twin is an
engine on the model's lossless re-encoding (``runtime.key_twin``). Both are made on first use,
kept on the engine that owns the model (memories sharing one engine share them too) and closed
with it; neither changes what the engine itself computes.
"""
from __future__ import annotations

import dataclasses

from ..errors import ModelError
from .engine import Engine
from .key_twin import q8_twin_path


__all__ = ["q8_twin", "sibling", "siblings"]


def sibling(engine: Engine, n_threads: int, n_seq_max: int = 1) -> Engine:
    """A second context on this engine's loaded model, with its own callback state, batch and
    KV cache: extraction on several threads without loading the weights twice.

    It keeps this engine's configuration except the thread count and the sequences per decode,
    and this engine's key layers. llama.cpp contexts of one model may decode on different
    threads at once (the weights are read-only); each context stays single-threaded in its use.
    It never frees the model: this engine closes its siblings before freeing it."""
    if engine._closed:
        raise ModelError("engine is closed")
    sib = object.__new__(Engine)
    sib.__dict__.update({k: engine.__dict__[k] for k in ("_L", "info", "n_embd", "n_layer",
                                                       "_model", "_vocab", "n_vocab")})
    sib.config = dataclasses.replace(engine.config, n_threads=max(1, int(n_threads)),
                                     n_seq_max=max(1, int(n_seq_max)), n_branches=0)  # keys only: no answer read
    sib.n_threads = sib.config.n_threads
    sib.key_layer = engine.key_layer
    sib._owner = engine
    sib._siblings = []
    sib._q8_twins = {}
    sib._make_context()
    sib.graph_tensors = engine.graph_tensors
    sib.set_key_layers(engine.key_layers, engine.key_pooling)
    engine._siblings.append(sib)
    return sib


def q8_twin(engine: Engine) -> Engine | None:
    """An engine on this model's lossless Q8_0 twin (``runtime.key_twin``: the Q5_0 weights
    re-encoded, the same numbers), for this engine's key layers; written to the cache and loaded
    on first use, closed with this engine. None when the model has no Q5_0 weights.

    When the deepest key layer pools its last row, the twin is cut after it
    (``EngineConfig.key_cut``): that layer's feed-forward half then runs on each prompt's last
    row only. For key extraction only (the opt-in fast ingest): it maps a second copy of the
    weights, and a memory's fingerprint stays the original model's."""
    owner = engine._owner or engine
    if owner._closed:
        raise ModelError("engine is closed")
    deepest = max(range(len(engine.key_layers)), key=lambda i: engine.key_layers[i])
    cut = engine.key_layers[deepest] + 1 if engine.key_pooling[deepest] == "last" else None
    if cut not in owner._q8_twins:
        path = q8_twin_path(owner.info.path, layers=cut)
        owner._q8_twins[cut] = None if path is None else Engine(
            path, dataclasses.replace(owner.config, key_cut=cut is not None, key_prefix_cache=False,
                                      key_layer=None, n_branches=0))
    twin = owner._q8_twins[cut]
    if twin is not None and (twin.key_layers, twin.key_pooling) != (engine.key_layers, engine.key_pooling):
        twin.set_key_layers(engine.key_layers, engine.key_pooling)
    return twin


def siblings(engine: Engine, count: int, n_threads: int, n_seq_max: int = 1) -> list[Engine]:
    """``count`` sibling contexts with this thread count and sequences per decode, made on first
    use and kept until this engine closes: a context costs its KV cache and compute buffers to
    make, so memories sharing one engine (the server, a sweep) share them too."""
    n_threads, n_seq_max = max(1, int(n_threads)), max(1, int(n_seq_max))
    same = [e for e in engine._siblings if (e.config.n_threads, e.config.n_seq_max) == (n_threads, n_seq_max)]
    while len(same) < count:
        same.append(sibling(engine, n_threads, n_seq_max))
    return same[:count]
