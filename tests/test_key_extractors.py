"""Which extractor an ingest gets (``method.key_extractors.choose_extractor``), from its options and
its preset alone; the extraction each one does is tested with the model (test_thread_ingest,
test_batched_keys, test_key_twin, test_ray_ingest)."""
from __future__ import annotations

import types

import pytest

from miita_edge.errors import InputError
from miita_edge.method.key_extractors import RAY_WORKERS, KeyOptions, LocalExtractor, choose_extractor, key_engine
from miita_edge.method.presets import default_preset, paper_preset
from miita_edge.method.templates import get_template
from miita_edge.method.thread_ingest import ThreadExtractor

ENGINE = types.SimpleNamespace(n_threads=4, key_layers=(12, 9), key_pooling=("last", "mean"))
PLAIN = get_template("plain")


@pytest.mark.parametrize("options, preset, cache, kind, contexts", [
    (KeyOptions(), default_preset(), None, LocalExtractor, None),
    (KeyOptions(batch=True), default_preset(), None, LocalExtractor, None),
    (KeyOptions(contexts=2), default_preset(), None, ThreadExtractor, 2),
    (KeyOptions(contexts=3), default_preset(), None, ThreadExtractor, 3),
    (KeyOptions(contexts=2), paper_preset(), None, LocalExtractor, None),  # corrections: the engine's own
    (KeyOptions(contexts=2), default_preset(), object(), LocalExtractor, None),  # an extract cache: ditto
])
def test_the_options_choose_the_extractor(options, preset, cache, kind, contexts):
    ex = choose_extractor(ENGINE, PLAIN, preset, options, max_prompt_tokens=64, cache=cache)
    assert type(ex) is kind and ex.max_prompt_tokens == 64
    if kind is ThreadExtractor:
        assert ex.contexts == contexts and ex.threads == max(1, 4 // contexts) and ex.engine is ENGINE
    else:
        assert ex.engine is ENGINE and ex.cache is cache and ex.batch_keys == options.batch
    ex.close()


def test_fast_keys_use_the_twin_on_at_least_two_contexts(monkeypatch):
    twin = types.SimpleNamespace(n_threads=4, key_layers=ENGINE.key_layers, key_pooling=ENGINE.key_pooling)
    monkeypatch.setattr("miita_edge.method.key_extractors.q8_twin", lambda e: twin if e is ENGINE else None)
    ex = choose_extractor(ENGINE, PLAIN, default_preset(), KeyOptions(fast=True))
    assert type(ex) is ThreadExtractor and ex.engine is twin and ex.contexts == 2
    assert key_engine(ENGINE, KeyOptions(fast=True)) is twin and key_engine(ENGINE, KeyOptions()) is ENGINE
    monkeypatch.setattr("miita_edge.method.key_extractors.q8_twin", lambda e: None)  # no Q5_0 weights
    assert key_engine(ENGINE, KeyOptions(fast=True)) is ENGINE


@pytest.mark.parametrize("workers, ray, contexts, ray_workers", [
    (None, None, 1, RAY_WORKERS),   # the default: one prompt per decode on the engine itself
    (3, None, 3, RAY_WORKERS),      # --contexts 3: three llama.cpp contexts
    (None, True, 1, RAY_WORKERS),   # --ray: the default number of Ray workers
    (5, True, 1, 5),                # --ray --contexts 5: five Ray workers, no local contexts
    (4, "ray://head:10001", 1, 4),  # --ray ADDRESS --contexts 4
])
def test_one_count_says_contexts_or_ray_workers(workers, ray, contexts, ray_workers):
    """``ingest --contexts N``: N extraction workers side by side, llama.cpp contexts without --ray,
    Ray workers with it (the local contexts are never used under Ray: choose_extractor takes Ray first)."""
    opt = KeyOptions.side_by_side(workers, ray=ray)
    assert (opt.contexts, opt.ray_workers, opt.ray, opt.fast) == (contexts, ray_workers, ray, False)


def test_options_refuse_what_cannot_run_in_one_line():
    for bad in (0, -1, True, 1.5):
        with pytest.raises(InputError, match="--contexts must be >= 1"):
            KeyOptions(contexts=bad)
        with pytest.raises(InputError, match=r"--contexts \(Ray workers\) must be >= 1"):
            KeyOptions.side_by_side(bad, ray=True)
    with pytest.raises(InputError, match="--fast-keys and --ray: choose one"):
        KeyOptions(fast=True, ray=True)
    with pytest.raises(InputError, match="--fast-keys: preset 'paper' computes corrections"):
        KeyOptions(fast=True).check_preset(paper_preset())
    KeyOptions(fast=True).check_preset(default_preset())
    with pytest.raises(Exception):  # frozen: chosen once, not switched after
        KeyOptions().contexts = 2  # type: ignore[misc]
