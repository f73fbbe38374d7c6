"""Which layers a model's keys come from, chosen by a criterion computed on the model itself.

Why: fixed shares of the depth (2/3 and 1/2) were picked on one model. On SmolLM2-135M the layers at
those shares (20 and 15 of 30) put a paraphrase's nearest key in another request's group more often
than not, and its memory retrieves the wrong answers; on Gemma-3-270M other layers separate better
than the fixed ones too. What a key must do is known without any benchmark: two phrasings of one
request must be nearer to each other than to other requests. So each model is measured on
``PARAPHRASES`` (everyday requests, three phrasings each, written for this purpose and unrelated to
any benchmark) through the memory's template, and the default preset takes the pair of layers
(one pooled at the prompt's last row, one averaged over its rows) whose combined key, stored as the
default stores keys (centred on the calibration mean, one sign bit per coordinate), finds a
phrasing's sibling as its nearest neighbour most often.

The pooling (the last row at one layer, the mean at the other) is not the criterion's to choose:
asked about ``DESIGNS`` (``bench/key_layers.py --designs``), it prefers the mean at both layers on
SmolLM2-135M, and that key loses on Banking77's dev rows (docs/method.md §2.2).

Cost: two passes per phrasing over every layer (120 passes), once per model and template, cached in
the user cache directory.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ..runtime import key_pass
from ..runtime.engine import Engine
from ..runtime.fingerprint import cache_dir, write_cached
from ..runtime.key_pooling import key_mean
from .calibration import CALIBRATION_INPUTS
from .templates import Template

__all__ = ["DESIGNS", "KeyLayerChoice", "PARAPHRASES", "best_choice", "choose_key_layers", "pair_scores"]

#: Everyday requests, three phrasings each.
PARAPHRASES = [
    ["my flight was cancelled, what now", "the airline called off my flight",
     "what do I do now that my flight is cancelled"],
    ["I forgot the password to my email", "I cannot remember my email password",
     "how do I get back into my email, the password is gone"],
    ["the heating in my flat is broken", "my radiator does not warm up anymore",
     "there is no heat coming from the heater at home"],
    ["I want to cancel my gym membership", "how can I stop my gym subscription", "please end my membership at the gym"],
    ["my package arrived damaged", "the box came crushed and the item is broken", "what I ordered was delivered broken"],
    ["can I bring my dog on the train", "are pets allowed on trains", "is it ok to travel by train with a dog"],
    ["what is a good recipe for dinner tonight", "suggest something I can cook this evening",
     "any ideas for what to make for supper"],
    ["I feel very tired all the time", "I am exhausted every single day", "why am I always so sleepy"],
    ["the wifi keeps disconnecting", "my internet connection drops every few minutes",
     "the wireless network cuts out constantly"],
    ["how do I renew my passport", "my passport expired, how do I get a new one",
     "what is the process for a passport renewal"],
    ["the neighbours are too loud at night", "people next door make noise late every night",
     "I cannot sleep because my neighbours party"],
    ["I was charged the wrong price at the store", "the shop billed me more than the shelf price",
     "the till charged me an incorrect amount"],
    ["my car makes a strange noise when braking", "there is a squeak from the brakes of my car",
     "the brakes on my car are making odd sounds"],
    ["I would like to book a table for two", "can I reserve dinner for two people", "a reservation for two tonight please"],
    ["my phone screen is cracked", "I dropped my phone and the glass broke", "the display of my mobile has a crack"],
    ["how can I learn to play piano", "what is the best way to start piano lessons", "I want to teach myself the piano"],
    ["my plants keep dying", "the plants in my house wither quickly", "why do all my houseplants die"],
    ["I need a doctor's appointment", "can I see a doctor this week", "I would like to book a visit with my GP"],
    ["the water from the tap is brown", "my tap water looks dirty and brown", "brown water comes out of the faucet"],
    ["I lost my wallet on the bus", "my purse was left behind on the bus", "I think I dropped my wallet while riding the bus"],
]
VERSION = 1  # of the criterion and its cache file
#: Poolings of the (first, second) key layer that ``best_choice`` can compare (the probe of
#: ``bench/key_layers.py --designs``); the first is the default's and the only one ``measure`` asks
#: about. ("mean", "last") is ("last", "mean") with the layers swapped, which the pair scores cover.
DESIGNS = (("last", "mean"), ("mean", "mean"), ("last", "last"))


@dataclass(frozen=True)
class KeyLayerChoice:
    """The chosen layers in key order and their score. ``last`` and ``mean`` name the first and the
    second key layer (pooled at the last row and averaged, unless ``pooling`` says otherwise)."""

    last: int
    mean: int
    accuracy: float  # share of phrasings whose nearest key is a sibling's
    margin: float  # mean cosine to siblings minus mean cosine to the rest
    pooling: tuple = ("last", "mean")  # how the first and the second layer are pooled

    @property
    def layers(self) -> list[int]:
        return [self.last, self.mean]


def _sign_rows(x: np.ndarray) -> np.ndarray:
    return np.where(x >= 0, 1.0, -1.0) / np.sqrt(x.shape[-1])


def pair_scores(last: np.ndarray, mean: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every (last-row layer a, averaged layer b): the nearest-neighbour accuracy and the
    sibling margin of the concatenated sign keys. ``last``/``mean``: (N, L, H) centred keys of N
    phrasings at L layers; ``groups``: (N,) the request each phrasing belongs to. Returns two (L, L)
    arrays (the diagonal, one layer twice, is -inf: a layer is captured once)."""
    N, L, _ = last.shape
    Sl = np.stack([_sign_rows(last[:, i]) @ _sign_rows(last[:, i]).T for i in range(L)])  # (L, N, N)
    Sm = np.stack([_sign_rows(mean[:, i]) @ _sign_rows(mean[:, i]).T for i in range(L)])
    same = groups[:, None] == groups[None, :]
    eye = np.eye(N, dtype=bool)
    sib, rest = same & ~eye, ~same
    acc = np.full((L, L), -np.inf)
    margin = np.full((L, L), -np.inf)
    for a in range(L):
        for b in range(L):
            if a == b:
                continue
            S = (Sl[a] + Sm[b]) / 2  # each block at unit norm, so the pair's cosine is their mean
            T = np.where(eye, -np.inf, S)
            acc[a, b] = float(np.mean(groups[np.argmax(T, axis=1)] == groups))
            margin[a, b] = float(S[sib].mean() - S[rest].mean())
    return acc, margin


def _keys(engine: Engine, template: Template, texts: list[str], layers: list[int], pooling: str,
          skip_bos: bool = True) -> np.ndarray:
    engine.set_key_layers(layers, [pooling] * len(layers))
    out = []
    for x in texts:
        toks = engine.tokenize(template.render_prompt(x))
        s, n = key_pass.prompt_key(engine, toks, engine.key_mask(toks, skip_bos))
        out.append(key_mean(s, n).reshape(len(layers), -1))
    return np.stack(out).astype(np.float64)


def best_choice(centred: dict, groups: np.ndarray, layers: list[int], designs=DESIGNS[:1]) -> KeyLayerChoice:
    """The pair (and, among ``designs``, the pooling) of best nearest-sibling accuracy, then the
    wider sibling margin, then the shallower deeper layer, then the shallower first layer, then the
    earlier design. ``centred``: pooling -> (N, L, H) centred keys at ``layers``. Key order: the
    last-row layer first; where both layers are pooled alike, the deeper one first (as the shipped
    design's last-row layer is the deeper on both measured models)."""
    best = None
    for rank, (pa, pb) in enumerate(designs):
        acc, margin = pair_scores(centred[pa], centred[pb], groups)
        for a in range(len(layers)):
            for b in range(len(layers)):
                if a == b or (pa == pb and a < b):  # a pair pooled alike is scored once
                    continue
                key = (acc[a, b], margin[a, b], -max(a, b), -min(a, b) if pa == pb else -a, -rank)
                if best is None or key > best[0]:
                    best = (key, a, b, pa, pb)
    (acc_ab, margin_ab, *_), a, b, pa, pb = best
    return KeyLayerChoice(layers[a], layers[b], float(acc_ab), float(margin_ab), (pa, pb))


def measure(engine: Engine, template: Template) -> KeyLayerChoice:
    """Run the criterion (restores the engine's key layers afterwards)."""
    saved = engine.key_layers, engine.key_pooling
    layers = list(range(1, engine.n_layer - 1))  # the last layer keeps only output rows
    texts = [t for g in PARAPHRASES for t in g]
    groups = np.array([i for i, g in enumerate(PARAPHRASES) for _ in g])
    try:
        centred = {}
        for pooling in ("last", "mean"):
            k = _keys(engine, template, texts, layers, pooling)
            c = _keys(engine, template, list(CALIBRATION_INPUTS), layers, pooling).mean(axis=0)
            centred[pooling] = k - c
    finally:
        engine.set_key_layers(list(saved[0]), list(saved[1]))
    # best accuracy, then the wider margin, then the shallower layers (cheaper key passes)
    return best_choice(centred, groups, layers)


def choose_key_layers(engine: Engine, template: Template, sha256: str) -> KeyLayerChoice:
    """``measure``, cached per (model, template) in the user cache directory."""
    path = cache_dir() / f"key-layers-{sha256[:16]}-{template.name}-v{VERSION}.json"
    try:
        d = json.loads(path.read_text())
        c = KeyLayerChoice(int(d["last"]), int(d["mean"]), float(d["accuracy"]), float(d["margin"]))
        if 0 < c.last < engine.n_layer - 1 and 0 < c.mean < engine.n_layer - 1 and c.last != c.mean:
            return c
    except (OSError, ValueError, KeyError, TypeError):
        pass
    c = measure(engine, template)
    text = json.dumps({"last": c.last, "mean": c.mean, "accuracy": c.accuracy, "margin": c.margin})
    write_cached(path, lambda tmp: tmp.write_text(text))
    return c
