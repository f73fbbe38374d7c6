"""Presets: every setting that decides how experiences become answers, as one value.

A memory stores its preset (only what differs from the named one) in its manifest, so whoever
opens it later answers with the settings it was built with.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..errors import InputError, StoreError
from ..memory.bank import BankConfig
from ..memory.manifest import check_fields
from ..runtime.engine import DEFAULT_KEY_DEPTHS, layers_at_depths
from ..runtime.key_pooling import KEY_POOLINGS
from .retrieval import RetrievalConfig

__all__ = ["PRESETS", "Preset", "check_memory_fields", "default_preset", "default_preset_v1", "get_preset",
           "paper_preset", "preset_names"]


@dataclass
class Preset:
    """Everything that decides how experiences become answers.

    ``eta`` is relative: the addition is eta·‖h_q‖·α_t·d̄, so it means the same
    share of the hidden state on models with different hidden scales.
    """

    name: str
    bank: BankConfig
    skip_bos: bool  # drop the BOS row from the mean-pooled key
    center_keys: bool  # subtract a fixed mean key before comparing/storing
    aggregation: str  # "paper" (eqs. 6-10, one d̄) | "prefix" (anchor vote, per-position, prefix-consistent)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    k_anchors: int = 8  # anchors voted over ("prefix" aggregation)
    eta: float = 0.05
    gate: str = "gated"
    correction_top_k: int = 0  # 0: exact R over all V rows
    # Which layers' outputs are pooled into the key (eq. 1), as shares of the model's depth, so a
    # preset means the same places in a deeper or shallower model: layer = round(depth·n_layer), at
    # most n_layer - 2 (the last layer keeps only output rows). (0.5,) is the paper's middle layer.
    # Several layers: the key is their concatenation, each block centred and at unit norm.
    key_depths: tuple = (0.5,)
    # How each key depth's rows are pooled, one entry per depth ("mean": every prompt row the key
    # mask keeps, eq. 1 as written; "last": the last of them, the template's answer cue). Empty:
    # "mean" everywhere, what every memory built before version 4 of the default has.
    key_pooling: tuple = ()
    # Order of a key's coordinates, whose first ones a narrowed key keeps: "index", or
    # "calibration" (each layer's block by the spread of the calibration keys, highest first).
    key_order: str = "index"
    # The relevance gate (method/relevance.py): memory steers only where it has something to say.
    relevance_gate: bool = False
    # Vote over each answer's centroid too (derived from its stored anchors and their counts).
    centroid_vote: bool = False
    # What a stored answer token adds at its position: "row", the unit LM-head row Norm(W_y); or
    # "head", the head-geometry direction that raises y by one logit over the average row
    # (method/head_geometry.py), summed over the answers that agree with the prefix, not normalised.
    direction: str = "row"
    # How a new memory's key layers are chosen: "depths", the shares in key_depths; or "paraphrase",
    # measured on the model (method/key_layers.py: one last-row layer, one averaged layer, in that
    # order, so key_pooling must be ("last", "mean")). A memory stores its layers either way.
    key_select: str = "depths"
    # The relevance gate also asks a query to come nearer to an answer's examples than any of
    # relevance.GENERIC_QUESTIONS does (each answer's null score).
    null_gate: bool = False
    # How the null is drawn when null_gate is on: "tail", each answer's 1-in-1,000 tail of the
    # generic questions' cosines (versions 5-8); "nearest", each answer's 1-in-20 tail and the
    # query nearer to the answer than to its own nearest generic question by 1/sqrt(K)
    # (relevance.nearest_margin).
    null_rule: str = "tail"
    # What eta is relative to: "hidden", the query's hidden norm ‖h_q‖ (the addition is
    # eta·‖h_q‖·α·d̄); or "push", the model's measured logit push G (eta·G·α·Σ w d, in logits).
    eta_unit: str = "hidden"
    # After a generated token that no steering answer has at its position, answers that began with
    # the generated first token and differ in at most one token per 8 positions keep steering
    # (steering.prefix_direction's recovery) instead of the memory letting go of the reply.
    recover: bool = False
    # The model reads the vote's leading answers (method/rerank.py): each of the top rerank_top
    # answers' weights times exp(rerank_lambda·PMI of its stored tokens given the query), where every
    # one of them stores at least rerank_min_tokens tokens. 0: the vote alone (every version before 8).
    rerank_lambda: float = 0.0
    rerank_top: int = 3
    rerank_min_tokens: int = 8
    # What the model reads of each leading answer: "pmi", log p(answer | query) - log p(answer |
    # empty query) (versions 8-10); "channel", log p(query | answer) (method/rerank.channel_logprob),
    # which needs the query's text and no baseline. Without the text (a prompt given as tokens),
    # "channel" falls back to "pmi".
    rerank_score: str = "pmi"
    # While a reply leads the steering (its answer stores at least hold_min_tokens tokens), a
    # produced token that none of the steering answers has at that position is replaced: the step is
    # decoded again with an addition that puts the leading token one logit above it
    # (steering.lead_push, Engine.generate's hold). 0: off (every version before 12).
    hold_min_tokens: int = 0
    # How keys are whitened before their sign bits are taken: "none"; "paraphrase", by the
    # within-group scatter of method/key_whitening.GROUPS measured on the model (derived at open,
    # never stored); or "replies": "paraphrase" for a memory whose first taught answers are replies
    # (their median is at least rerank_min_tokens tokens), "none" for one of labels, decided at its
    # first ingest and kept in its manifest (method/key_whitening.whiten_replies).
    key_whitening: str = "none"
    # Version of the named preset this memory was built with (1: the first, which stored no version).
    version: int = 1

    def key_layers(self, n_layer: int) -> list[int]:
        """The key layers this preset uses on a model of ``n_layer`` layers, in key order (a layer
        that two depths round to on a shallow model counts once)."""
        return layers_at_depths(self.key_depths, n_layer)

    def key_poolings(self, n_layer: int) -> list[str]:
        """The pooling of each of ``key_layers(n_layer)``, in the same order (a layer that two depths
        round to keeps the first depth's pooling)."""
        if self.key_select == "paraphrase" and n_layer - 2 >= 2:  # two layers measured on the model
            return list(self.key_pooling)
        pooling = self.key_pooling or ("mean",) * len(self.key_depths)
        out, seen = [], set()
        for d, p in zip(self.key_depths, pooling):
            k = layers_at_depths((d,), n_layer)[0]
            if k not in seen:
                seen.add(k)
                out.append(p)
        return out

    def to_json(self) -> dict:
        """Only what differs from the named preset (the manifest is counted in the budget)."""
        make = _VERSIONS.get((self.name, self.version))
        full, base = asdict(self), asdict(make()) if make else {}
        out = {"name": self.name}
        if self.version != 1:
            out["version"] = self.version
        for k, v in full.items():
            if isinstance(v, dict):
                diff = {kk: vv for kk, vv in v.items() if base.get(k, {}).get(kk) != vv}
                if diff:
                    out[k] = diff
            elif k not in ("name", "version") and base.get(k) != v:
                out[k] = list(v) if isinstance(v, tuple) else v
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Preset":
        if d.get("name") not in PRESETS:
            raise StoreError(f"unknown preset {d.get('name')!r} in memory manifest")
        # A memory stores only what differs from its named preset *as it was then*: start from
        # that version, so a memory built before the preset changed keeps its settings.
        version = d.get("version", 1)
        make = _VERSIONS.get((d["name"], version))
        if make is None:
            raise StoreError(f"preset {d['name']!r} version {version!r} is newer than this miita-edge knows; upgrade")
        p = make()
        for k, v in d.items():
            if k in ("name", "version"):
                continue
            if k in ("key_depths", "key_pooling"):
                v = tuple(v) if isinstance(v, list) else v
            if isinstance(v, dict):
                sub = getattr(p, k)
                for kk, vv in v.items():
                    setattr(sub, kk, vv)
            else:
                setattr(p, k, v)
        p.bank.validate()
        p.retrieval.validate()
        p.validate_keys()
        return p

    def validate_keys(self) -> None:
        if not (isinstance(self.key_depths, tuple) and self.key_depths and all(
                isinstance(d, (int, float)) and not isinstance(d, bool) and 0.0 <= d <= 1.0 for d in self.key_depths)):
            raise StoreError(f"preset key_depths {self.key_depths!r} are not shares of the model's depth in [0, 1]")
        if not (isinstance(self.key_pooling, tuple) and len(self.key_pooling) in (0, len(self.key_depths))
                and all(p in KEY_POOLINGS for p in self.key_pooling)):
            raise StoreError(f"preset key_pooling {self.key_pooling!r} is not one of {KEY_POOLINGS} per key depth")
        if self.key_order not in ("index", "calibration"):
            raise StoreError(f"preset key_order {self.key_order!r} is not 'index' or 'calibration'")
        if self.key_select not in ("depths", "paraphrase"):
            raise StoreError(f"preset key_select {self.key_select!r} is not 'depths' or 'paraphrase'")
        if self.key_select == "paraphrase" and self.key_pooling != ("last", "mean"):
            raise StoreError("preset key_select 'paraphrase' needs key_pooling ('last', 'mean')")
        if self.key_whitening not in ("none", "paraphrase", "replies"):
            raise StoreError(f"preset key_whitening {self.key_whitening!r} is not 'none', 'paraphrase' or 'replies'")
        if self.key_whitening != "none" and not self.center_keys:
            raise StoreError("preset key_whitening needs center_keys (the scatter is of centred keys)")
        if self.null_rule not in ("tail", "nearest"):
            raise StoreError(f"preset null_rule {self.null_rule!r} is not 'tail' or 'nearest'")
        if self.direction not in ("row", "head"):
            raise StoreError(f"preset direction {self.direction!r} is not 'row' or 'head'")
        if self.eta_unit not in ("hidden", "push"):
            raise StoreError(f"preset eta_unit {self.eta_unit!r} is not 'hidden' or 'push'")
        if not isinstance(self.recover, bool):
            raise StoreError(f"preset recover {self.recover!r} is not true or false")
        if not (isinstance(self.rerank_lambda, (int, float)) and not isinstance(self.rerank_lambda, bool)
                and self.rerank_lambda >= 0):
            raise StoreError(f"preset rerank_lambda {self.rerank_lambda!r} is not a number >= 0")
        if self.rerank_score not in ("pmi", "channel"):
            raise StoreError(f"preset rerank_score {self.rerank_score!r} is not 'pmi' or 'channel'")
        if not (isinstance(self.hold_min_tokens, int) and not isinstance(self.hold_min_tokens, bool)
                and self.hold_min_tokens >= 0):
            raise StoreError(f"preset hold_min_tokens {self.hold_min_tokens!r} is not a whole number >= 0")
        for name in ("rerank_top", "rerank_min_tokens"):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise StoreError(f"preset {name} {v!r} is not a whole number >= 1")
        if self.direction == "head" and self.bank.payload != "tokens":
            raise StoreError("preset direction 'head' needs the 'tokens' payload")

    def describe(self) -> dict:
        return asdict(self)


def paper_preset_v1() -> Preset:
    """Section 3 as written: one averaged direction per experience, max-anchor
    semantic score + uncertainty rerank, softmax aggregation, gated addition.
    η: the paper's 0.5 is absolute on Qwen3; here η is relative to ‖h_q‖, and
    0.2 was the best of 0.05/0.1/0.2/0.4 on Banking77 stage 1 (docs/method.md §7).
    Kept so that memories built with it keep their uncentred keys."""
    return Preset("paper", BankConfig(payload="mean", dir_precision="float32", key_precision="float32"),
                  skip_bos=False, center_keys=False, aggregation="paper", eta=0.2)


def paper_preset() -> Preset:
    """Section 3 as written, with eq. 1's key pooled without the BOS row and centred on the model's
    calibration mean: on a model whose hidden states share a large common component (SmolLM2-135M),
    uncentred mean-pooled keys of unrelated inputs have cosines of 0.9998-1.0018, and eq. 8's
    retrieval cannot tell them apart. The equations themselves are unchanged."""
    p = paper_preset_v1()
    p.skip_bos = True
    p.center_keys = True
    p.version = 2
    return p


def default_preset_v1() -> Preset:
    """Version 1 of the default (middle-layer keys, no relevance gate): kept so that memories
    built with it open with the settings they were built with."""
    return Preset("default", BankConfig(payload="tokens", key_precision="bit"),
                  skip_bos=True, center_keys=True, aggregation="prefix", k_anchors=8,
                  retrieval=RetrievalConfig(T_agg=0.02), eta=0.3)


def default_preset_v2() -> Preset:
    """Version 2 of the default: keys from two layers (2/3 and 1/2 of the depth: 12 and 9 on
    Gemma-3-270M), coordinates ordered by the calibration keys' spread so a tight budget narrows
    keys instead of evicting answers, the relevance gate, and each answer's centroid in the vote.
    Kept so that memories built with it repair as they always did."""
    return Preset("default", BankConfig(payload="tokens", key_precision="bit", relevance=True, shrink_keys=True),
                  skip_bos=True, center_keys=True, aggregation="prefix", k_anchors=8,
                  retrieval=RetrievalConfig(T_agg=0.02), eta=0.3, key_depths=DEFAULT_KEY_DEPTHS,
                  key_order="calibration", relevance_gate=True, centroid_vote=True, version=2)


def default_preset_v3() -> Preset:
    """Version 2, and repair folds the anchors whose union distorts least (Ward's criterion) instead
    of the closest pair, so an answer's lone examples join its centroid instead of outliving it
    (§10.5). Kept so that memories built with it keep their mean-pooled keys."""
    p = default_preset_v2()
    p.bank.anchor_fold = "ward"
    p.version = 3
    return p


def default_preset_v4() -> Preset:
    """Version 3, and the deeper key layer is pooled at the last prompt row (the template's answer
    cue, where the model has gathered what it is about to say) instead of the mean of the prompt's
    rows; the middle layer keeps the mean, which carries the input's content (§10.7). Kept so that
    memories built with it steer along the head rows they were built with."""
    p = default_preset_v3()
    p.key_pooling = ("last", "mean")
    p.version = 4
    return p


def default_preset_v5() -> Preset:
    """Version 4, and each answer token steers along its head-geometry direction with the model's
    measured logit push (method/head_geometry.py), so the taught token wins on any head, not only
    on one whose rows all have the same norm. Kept so that memories built with it let go of a
    reply at its first divergent token, as they did."""
    p = default_preset_v4()
    p.direction = "head"
    p.eta_unit = "push"
    p.key_select = "paraphrase"
    p.null_gate = True
    # the full push at every answer position: the relevance gate decides whether to steer and the
    # prefix rule where to stop; the paper's α = cos(h_t, h_q) fell to ~0.5 after one token and
    # let the model end a taught two-word answer after its first word
    p.gate = "ungated"
    p.eta = 1.0
    p.version = 5
    return p


def default_preset_v6() -> Preset:
    """Version 5, and a reply that began right recovers from a divergent token (a sampled one,
    say) instead of losing the memory for its remaining tokens (``Preset.recover``). Kept so that
    memories built with it vote as they did."""
    p = default_preset_v5()
    p.recover = True
    p.version = 6
    return p


def default_preset_v7() -> Preset:
    """Version 6 with the anchor vote's k and T chosen on dev rows (``bench/vote.py``,
    docs/method.md §14) instead of the test rows version 1 took them from: 16 anchors at T = 0.04.
    Kept so that memories built with it vote as they did."""
    p = default_preset_v6()
    p.k_anchors = 16
    p.retrieval.T_agg = 0.04
    p.version = 7
    return p


def default_preset_v8() -> Preset:
    """Version 7, and the model reads the vote's three leading answers where each is a reply of
    16 tokens or more, multiplying each one's weight by exp(0.1·PMI) (method/rerank.py; λ chosen
    by ``bench/rerank.py`` on held-out training rows, docs/method.md §15). Labels (at most 10
    tokens on Banking77) are never reranked. Kept so that memories built with it gate as they did."""
    p = default_preset_v7()
    p.rerank_lambda = 0.1
    p.rerank_top = 3
    p.rerank_min_tokens = 16
    p.version = 8
    return p


def default_preset_v9() -> Preset:
    """Version 9: version 8, and the
    relevance gate asks each query to come nearer to an answer's examples than to the generic
    question it most resembles, with each answer's own null at a 1-in-20 tail instead of 1 in
    1,000 (``null_rule = "nearest"``, docs/method.md §16): on SmolLM2-135M the old null declined a
    quarter of the on-topic paraphrases; this one steers 95% of them, and fewer off-topic
    prompts than before on Gemma-3-270M."""
    p = default_preset_v8()
    p.null_rule = "nearest"
    p.version = 9
    return p


def default_preset_v10() -> Preset:
    """Version 10: version 9, and a memory
    whose first taught answers are replies (a median of 16 tokens or more) keeps its keys whitened
    against paraphrase noise (``key_whitening = "replies"``, docs/method.md §17): its answer is
    decided by what is asked, and whitening finds the request more often (the dozen-intent canned
    replies 85.3 -> 91.3% on Gemma-3-270M, 67.0 -> 78.3% on SmolLM2-135M, means of three draws);
    a memory of labels keeps version 9's keys, because whitening lost DSC's sentiment on its dev
    rows (-4.5 points on Gemma-3-270M)."""
    p = default_preset_v9()
    p.key_whitening = "replies"
    p.version = 10
    return p


def default_preset_v11() -> Preset:
    """Version 11: version 10, and the rerank reads how well each leading reply explains the query,
    log p(query | reply) (the noisy channel, ``rerank_score = "channel"``, λ 0.3; docs/method.md
    §18), instead of the PMI of the reply given the query: the PMI against an empty prompt favours
    a reply that any in-domain question makes likely, and the channel score needs no baseline."""
    p = default_preset_v10()
    p.rerank_score = "channel"
    p.rerank_lambda = 0.3
    p.version = 11
    return p


def default_preset() -> Preset:
    """Our default; every choice is measured in docs/method.md. Version 12: version 11, and the hold
    (``hold_min_tokens = 16``, docs/method.md §19): while a reply leads the steering, a token that
    none of the steering answers has at that position (" if" for " If", a near-identical head row
    the push raised too) is replaced by the leading answer's, the step decoded again with an
    addition that puts it one logit above; the prefix rule had let the whole reply go after it."""
    p = default_preset_v11()
    p.hold_min_tokens = 16
    p.version = 12
    return p


PRESETS = {"paper": paper_preset, "default": default_preset}
#: Every (name, version) a memory may have been built with.
_VERSIONS = {("paper", 1): paper_preset_v1, ("paper", 2): paper_preset, ("default", 1): default_preset_v1, ("default", 2): default_preset_v2,
             ("default", 3): default_preset_v3, ("default", 4): default_preset_v4,
             ("default", 5): default_preset_v5, ("default", 6): default_preset_v6, ("default", 7): default_preset_v7,
             ("default", 8): default_preset_v8, ("default", 9): default_preset_v9,
             ("default", 10): default_preset_v10, ("default", 11): default_preset_v11,
             ("default", 12): default_preset}


def preset_names() -> list[str]:
    """The presets a user selects: each name, at its current version. Earlier versions stay
    readable for the memories built with them (``Preset.from_json``), and ``preset_version``
    makes one for code that must reproduce such a memory (the benches, the evaluation's stand-ins)."""
    return list(PRESETS)


def get_preset(name: str) -> Preset:
    """A preset by name: ``default`` or ``paper``, at its current version."""
    if name not in PRESETS:
        raise InputError(f"unknown preset {name!r}; known: {', '.join(preset_names())}")
    return PRESETS[name]()


def preset_version(name: str, version: int) -> Preset:
    """A named preset as it was at ``version`` (what a memory built then keeps)."""
    make = _VERSIONS.get((name, version))
    if make is None:
        raise InputError(f"unknown preset {name!r} version {version!r}")
    return make()


def check_memory_fields(path, fields) -> Preset:
    """Validate a memory's fields in their long form (``memory.manifest.check_fields``) and parse its
    preset: a damaged or foreign manifest is one StoreError naming the field."""
    check_fields(path, fields)
    try:
        return Preset.from_json(fields["preset"])
    except StoreError as exc:
        raise StoreError(f"memory {path}: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        why = str(exc).splitlines()[0][:80] if str(exc) else type(exc).__name__
        raise StoreError(f"memory {path}: manifest preset is invalid ({why}); not a memory this miita-edge "
                         f"can open") from None
