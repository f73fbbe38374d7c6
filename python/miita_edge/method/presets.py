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
from .key_whitening import REPLY_MIN_TOKENS
from .retrieval import RetrievalConfig
from .templates import KEY_PROMPTS

__all__ = ["PAST_VERSIONS", "PRESETS", "Preset", "RETIRED_FIELDS", "check_memory_fields", "default_preset", "get_preset",
           "paper_preset", "preset_names", "preset_version"]


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
    # While a reply leads the steering (its answer stores at least hold_min_tokens tokens), a
    # produced token that none of the steering answers has at that position is replaced: the step is
    # decoded again with an addition that puts the leading token one logit above it
    # (steering.lead_push, Engine.generate's hold). 0: off (every version before 12).
    hold_min_tokens: int = 0
    # How keys are whitened before their sign bits are taken: "none"; "paraphrase", by the
    # within-group scatter of method/key_whitening.GROUPS measured on the model (derived at open,
    # never stored); or "replies": "paraphrase" for a memory whose first taught answers are replies
    # (their median is at least key_whitening.REPLY_MIN_TOKENS), "none" for one of labels, decided at its
    # first ingest and kept in its manifest (method/key_whitening.whiten_replies).
    key_whitening: str = "none"
    # The key frame's axes (method/key_axes.py): "coordinates", the model's own (ordered by
    # key_order); "general", rotated onto the principal axes of the model's general prompts
    # (highest variance first, after any whitening; key_order is then not read); or "leading", those
    # axes' bits stored before all the coordinates (overcomplete: narrow keys keep the axes, wide
    # keys the coordinates too); or "narrowed", the coordinates while a key holds every one, and the
    # "leading" frame once repair narrows it (MemoryBank.key_narrow). Derived at open.
    key_axes: str = "coordinates"
    # How the axes' frame weighs its rows in the float vote (method/key_axes.unit_rows_of): "none",
    # as the principal axes come (each axis as large as its variance); "unit", every row scaled to
    # the same size over the general prompts. A key's bits stay the same. Read only with key_axes.
    key_axes_scale: str = "none"
    # How far an answer taught by one example reaches (method/relevance.py): "repeat", only a query
    # that repeats the example exactly; "paraphrase", as near as the model's own paraphrases come
    # (relevance.paraphrase_reach over key_whitening.GROUPS in the memory's key frame);
    # "paraphrase-heldout", the same, but in a whitened memory measured on groups its whitening was
    # not fitted on (two folds of GROUPS, each whitened by the other's scatter).
    single_reach: str = "repeat"
    # Whether that reach also trusts an answer taught more than once (beside its radius test): one
    # example is evidence for its own neighbourhood however many others share its answer.
    reach_every: bool = False
    # Whether the reach leaves out an answer whose example has another answer's example as near as a
    # paraphrase comes (relevance.contested): a neighbourhood two answers share decides neither.
    reach_contested: bool = False
    # Where the retrieved answer nearest to the query is not trusted by the gate, abstain (the frozen
    # model answers) instead of steering with the answers that remain.
    abstain: bool = False
    # Where the answer nearest to the query is trusted by the paraphrase reach alone, how far (in best
    # cosine of sign bits) it must lead every other retrieved answer; 0: no such test.
    reach_margin: float = 0.0
    # Where > 0, the trust of an answer that keeps its taught inputs (taught once, or by as many inputs
    # as BankConfig.evidence_inputs) is the model's reading,
    # not the paraphrase reach (method/verify.read_confirmed): where it is the nearest answer, it steers
    # if its taught question makes the query at least this many nats likelier than a neutral question
    # does and VERIFY_MARGIN likelier than the other nearest answers' questions; 0: the reach decides.
    read_reach: float = 0.0
    # The model reads the vote's leading answers (method/answer_reading.py): each one's weight times
    # exp(answer_reading * PMI(answer; query)) under the frozen model; 0: the vote's weights as they are.
    answer_reading: float = 0.0
    # What the gate's general-question tests (the null and the nearest question) compare: "bits",
    # the query's sign bits with stored bits (popcount), as the radius is measured; or "float", the
    # float query with stored bits, as the vote scores (one side unquantised).
    gate_query: str = "bits"
    # How a key's prompt is written (method/templates.KEY_PROMPTS): "memory", the memory's own template
    # (eq. 1 as written, the key pooled from the prompt the answer is generated from); "meaning", the
    # input in canonical form inside a prompt that asks for its meaning (a key pass of its own at ask).
    key_prompt: str = "memory"
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
        made = _at_version(self.name, self.version)
        full, base = asdict(self), asdict(made) if made else {}
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
        p = _at_version(d["name"], version)
        if p is None:
            raise StoreError(f"preset {d['name']!r} version {version!r} is newer than this miita-edge knows; upgrade")
        for k, v in d.items():
            if k in ("name", "version") or k in RETIRED_FIELDS:  # a retired mechanism is not read
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
        if self.key_axes not in ("coordinates", "general", "leading", "narrowed"):
            raise StoreError(f"preset key_axes {self.key_axes!r} is not 'coordinates', 'general', 'leading' or 'narrowed'")
        if self.key_axes_scale not in ("none", "unit"):
            raise StoreError(f"preset key_axes_scale {self.key_axes_scale!r} is not 'none' or 'unit'")
        if self.key_axes != "coordinates" and not self.center_keys:
            raise StoreError(f"preset key_axes {self.key_axes!r} needs center_keys (the axes are of centred keys)")
        if self.single_reach not in ("repeat", "paraphrase", "paraphrase-heldout"):
            raise StoreError(f"preset single_reach {self.single_reach!r} is not 'repeat', 'paraphrase' or "
                             "'paraphrase-heldout'")
        if not isinstance(self.reach_every, bool):
            raise StoreError(f"preset reach_every {self.reach_every!r} is not true or false")
        if self.gate_query not in ("bits", "float"):
            raise StoreError(f"preset gate_query {self.gate_query!r} is not 'bits' or 'float'")
        if not isinstance(self.abstain, bool):
            raise StoreError(f"preset abstain {self.abstain!r} is not true or false")
        if (isinstance(self.reach_margin, bool) or not isinstance(self.reach_margin, (int, float))
                or not 0 <= self.reach_margin < 2):
            raise StoreError(f"preset reach_margin {self.reach_margin!r} is not a number in [0, 2)")
        if (isinstance(self.answer_reading, bool) or not isinstance(self.answer_reading, (int, float))
                or not 0 <= self.answer_reading <= 10):
            raise StoreError(f"preset answer_reading {self.answer_reading!r} is not a number in [0, 10]")
        if (isinstance(self.read_reach, bool) or not isinstance(self.read_reach, (int, float))
                or not 0 <= self.read_reach <= 100):
            raise StoreError(f"preset read_reach {self.read_reach!r} is not a number of nats in [0, 100]")
        if self.null_rule not in ("tail", "nearest"):
            raise StoreError(f"preset null_rule {self.null_rule!r} is not 'tail' or 'nearest'")
        if self.direction not in ("row", "head"):
            raise StoreError(f"preset direction {self.direction!r} is not 'row' or 'head'")
        if self.eta_unit not in ("hidden", "push"):
            raise StoreError(f"preset eta_unit {self.eta_unit!r} is not 'hidden' or 'push'")
        if not (isinstance(self.hold_min_tokens, int) and not isinstance(self.hold_min_tokens, bool)
                and self.hold_min_tokens >= 0):
            raise StoreError(f"preset hold_min_tokens {self.hold_min_tokens!r} is not a whole number >= 0")
        if self.direction == "head" and self.bank.payload != "tokens":
            raise StoreError("preset direction 'head' needs the 'tokens' payload")
        if self.key_prompt not in KEY_PROMPTS:
            raise StoreError(f"preset key_prompt {self.key_prompt!r} is not one of {', '.join(KEY_PROMPTS)}")
        if self.key_prompt != "memory" and self.bank.payload != "tokens":
            # eq. 2's corrections are read from the pass that pools the key: one prompt for both
            raise StoreError(f"preset key_prompt {self.key_prompt!r} needs the 'tokens' payload")

    def describe(self) -> dict:
        return asdict(self)


#: How far an answer the paraphrase reach alone trusts must lead every other retrieved answer (best
#: cosine of sign bits). Chosen on the personal facts' dev half (bench/facts_reach.py --margins,
#: Gemma): the largest margin whose step from the one before avoided more answers of another fact
#: than it lost right ones (docs/method.md §11).
REACH_MARGIN = 0.01

#: The exponent of the model's reading of an answer in its weight (method/answer_reading.py): weight
#: times exp(ANSWER_READING * PMI). Chosen on Banking77's dev rows at 1% (bench/rerank_probe.py, both
#: models, the vote's first answer among its 4 leading ones): the lambda of 0.05 / 0.1 / 0.2 / 0.3 / 0.5 / 1
#: with the most right over both models (396 / 407 / 403 / 403 / 398 / 380 of 616; docs/method.md §11).
ANSWER_READING = 0.1


#: How many nats likelier than after a neutral question a taught question must make a query before
#: the model's reading trusts its answer (Preset.read_reach, method/verify.read_confirmed). Measured
#: on the model's paraphrase groups (key_whitening.GROUPS, no benchmark's rows): the threshold that
#: best separates each phrasing read after its nearest sibling from it read after its nearest
#: non-sibling, 9.38 on Gemma-3-270M and 9.36 on SmolLM2-135M (bench/admit_probe.py groups;
#: docs/method.md §11).
READ_REACH = 9.4


#: The narrowest key the default's repair may leave (bits; ``BankConfig.min_key_bits``). Chosen on dev rows:
#: Banking77 at 0.25% and 0.5%, both models, the vote with the relevance gate (64 the best of 32 / 48 / 64 / 96 /
#: 128 under version 21's keys), then the dev ablation of every benchmark (docs/method.md §11). A memory that
#: records no floor narrowed to ``memory.prototype.MIN_KEY_BITS`` (96), as every default before version 22.
NARROW_FLOOR = 64


def default_preset() -> Preset:
    """The default, whole, in one place: what ``ingest``, ``ask`` and ``serve`` use. docs/method.md
    describes each part in the order a query meets it, and its constants table says where every
    number comes from (derived from the model, chosen on named dev rows, or fixed by construction)."""
    return Preset(
        "default",
        BankConfig(payload="tokens", key_precision="bit", relevance=True, shrink_keys=True, anchor_fold="ward",
                   narrow_rule="rival-shared", evidence=True, evidence_inputs=2, min_key_bits=NARROW_FLOOR),
        skip_bos=True, center_keys=True, aggregation="prefix",
        retrieval=RetrievalConfig(T_agg=0.04), k_anchors=16,
        eta=1.25, eta_unit="push", direction="head", gate="ungated",
        key_depths=DEFAULT_KEY_DEPTHS, key_pooling=("last", "mean"), key_select="paraphrase",
        key_order="calibration", key_whitening="replies",
        relevance_gate=True, null_gate=True, null_rule="nearest", centroid_vote=True,
        single_reach="paraphrase-heldout", abstain=True, reach_margin=REACH_MARGIN, answer_reading=ANSWER_READING,
        read_reach=READ_REACH,
        key_prompt="meaning",
        hold_min_tokens=REPLY_MIN_TOKENS,  # the hold defends replies, by the same line whitening draws
        version=22)


def paper_preset() -> Preset:
    """Section 3 as written (eqs. 1-11): one averaged direction per experience, max-anchor semantic
    score + uncertainty rerank, softmax aggregation, gated addition. Eq. 1's key is pooled without
    the BOS row and centred on the model's calibration mean: on a model whose hidden states share a
    large common component (SmolLM2-135M), uncentred mean-pooled keys of unrelated inputs have
    cosines of 0.9998-1.0018 and eq. 8 cannot tell them apart; the equations are unchanged. η is
    relative to ‖h_q‖ (the paper's 0.5 is absolute on Qwen3); 0.2 was the best of 0.05/0.1/0.2/0.4
    on Banking77 stage 1 (docs/method.md)."""
    return Preset("paper", BankConfig(payload="mean", dir_precision="float32", key_precision="float32"),
                  skip_bos=True, center_keys=True, aggregation="paper", eta=0.2, version=2)


PRESETS = {"paper": paper_preset, "default": default_preset}

#: Every earlier version a memory may have been built with, as data: the fields in which it differs
#: from today's preset of that name (``bank`` and ``retrieval`` as dicts of their own fields). Read
#: only to open a memory that recorded such a version (``Preset.from_json``) and by the benchmark
#: harness (``miita-default@N``); users choose a name, never a version. CHANGELOG.md tells why each
#: version changed; tests/test_presets.py checks every entry against the settings archived when each
#: version was current.
#: What every default before version 16 had in common against it: keys were pooled from the input as
#: typed, and an answer the reach alone trusted steered however near another answer's example came.
_BEFORE_16 = {"key_prompt": "memory", "reach_margin": 0.0}
#: What every default before version 13 had in common against it: an answer taught once steered only on an
#: exact repeat, and a declined nearest answer left the vote to the others.
_BEFORE_13 = {"single_reach": "repeat", "abstain": False, **_BEFORE_16}
#: ... and before version 15, repair narrowed a key to its prefix in the frame's order.
_PREFIX = {"narrow_rule": "prefix"}

PAST_VERSIONS: dict[tuple[str, int], dict] = {
    ("default", 1): {"bank": {"relevance": False, "shrink_keys": False, "anchor_fold": "closest", **_PREFIX},
                     "retrieval": {"T_agg": 0.02}, "k_anchors": 8, "eta": 0.3, "gate": "gated", "key_depths": [0.5],
                     "key_pooling": [], "key_order": "index", "relevance_gate": False, "centroid_vote": False,
                     "direction": "row", "key_select": "depths", "null_gate": False, "null_rule": "tail",
                     "eta_unit": "hidden", "hold_min_tokens": 0, "key_whitening": "none", **_BEFORE_13},
    ("default", 2): {"bank": {"anchor_fold": "closest", **_PREFIX}, "retrieval": {"T_agg": 0.02}, "k_anchors": 8,
                     "eta": 0.3, "gate": "gated", "key_pooling": [], "direction": "row", "key_select": "depths",
                     "null_gate": False, "null_rule": "tail", "eta_unit": "hidden",
                     "hold_min_tokens": 0, "key_whitening": "none", **_BEFORE_13},
    ("default", 3): {"retrieval": {"T_agg": 0.02}, "k_anchors": 8, "eta": 0.3, "gate": "gated", "key_pooling": [],
                     "direction": "row", "key_select": "depths", "null_gate": False, "null_rule": "tail",
                     "eta_unit": "hidden", "hold_min_tokens": 0, "key_whitening": "none", **_BEFORE_13,
                     "bank": _PREFIX},
    ("default", 4): {"retrieval": {"T_agg": 0.02}, "k_anchors": 8, "eta": 0.3, "gate": "gated", "direction": "row",
                     "key_select": "depths", "null_gate": False, "null_rule": "tail", "eta_unit": "hidden",
                     "hold_min_tokens": 0, "key_whitening": "none", **_BEFORE_13, "bank": _PREFIX},
    ("default", 5): {"retrieval": {"T_agg": 0.02}, "k_anchors": 8, "null_rule": "tail",
                     "hold_min_tokens": 0, "key_whitening": "none", "eta": 1.0, **_BEFORE_13, "bank": _PREFIX},
    ("default", 6): {"retrieval": {"T_agg": 0.02}, "k_anchors": 8, "null_rule": "tail", "hold_min_tokens": 0,
                     "key_whitening": "none", "eta": 1.0, **_BEFORE_13, "bank": _PREFIX},
    ("default", 7): {"null_rule": "tail", "hold_min_tokens": 0, "key_whitening": "none", "eta": 1.0, **_BEFORE_13,
                     "bank": _PREFIX},
    ("default", 8): {"null_rule": "tail", "hold_min_tokens": 0, "key_whitening": "none", "eta": 1.0, **_BEFORE_13,
                     "bank": _PREFIX},
    ("default", 9): {"hold_min_tokens": 0, "key_whitening": "none", "eta": 1.0, **_BEFORE_13, "bank": _PREFIX},
    ("default", 10): {"hold_min_tokens": 0, "eta": 1.0, **_BEFORE_13, "bank": _PREFIX},
    ("default", 11): {"hold_min_tokens": 0, "eta": 1.0, **_BEFORE_13, "bank": _PREFIX},
    ("default", 12): {"eta": 1.0, **_BEFORE_13, "bank": _PREFIX},
    ("default", 13): {"bank": _PREFIX, "single_reach": "paraphrase", **_BEFORE_16},
    ("default", 14): {"bank": _PREFIX, **_BEFORE_16},
    ("default", 15): _BEFORE_16,
    ("default", 16): {},
    ("default", 17): {},
    ("default", 18): {},
    ("default", 19): {},
    ("default", 20): {},
    ("default", 21): {},
    ("paper", 1): {"skip_bos": False, "center_keys": False},
}
#: What every default before version 17 had in common against it: no answer kept its taught input, so
#: the model never checked an answer the paraphrase reach alone trusted (method/verify.py).
for (_name, _v), _diff in PAST_VERSIONS.items():
    if _name == "default" and _v < 17:
        _diff["bank"] = {**_diff.get("bank", {}), "evidence": False}
#: What every default before version 18 had in common against it: the vote's weights were the keys'
#: alone; the model did not read the leading answers (method/answer_reading.py).
for (_name, _v), _diff in PAST_VERSIONS.items():
    if _name == "default" and _v < 18:
        _diff["answer_reading"] = 0.0

#: What every default before version 19 had in common against it: the key's paraphrase reach, not the
#: model's reading, decided whether an answer taught once steered (method/verify.read_confirmed).
for (_name, _v), _diff in PAST_VERSIONS.items():
    if _name == "default" and _v < 19:
        _diff["read_reach"] = 0.0

#: What every default before version 20 had in common against it: an answer taught by a second input let
#: its evidence go, and its radius judged it (memory/prototype.joined_evidence).
for (_name, _v), _diff in PAST_VERSIONS.items():
    if _name == "default" and _v < 20:
        _diff["bank"] = {**_diff.get("bank", {}), "evidence_inputs": 1}

#: What every default from version 16 to 20 had in common against it: keys were pooled from the memory's
#: own prompt with the input folded, not from a prompt that asks for the input's meaning (templates.KEY_PROMPTS).
for (_name, _v), _diff in PAST_VERSIONS.items():
    if _name == "default" and 16 <= _v < 21:
        _diff["key_prompt"] = "folded"

#: What every default before version 22 had in common against it: repair narrowed keys to 96 bits at the least
#: (``memory.prototype.MIN_KEY_BITS``), not to 64, before it merged or evicted an answer; before version 13, to 32.
for (_name, _v), _diff in PAST_VERSIONS.items():
    if _name == "default" and _v < 22:
        _diff["bank"] = {**_diff.get("bank", {}), "min_key_bits": 96 if _v >= 13 else 32}

#: Fields of mechanisms the method no longer has, each with why it went. A manifest that records one
#: (a memory built while it existed) still opens: ``Preset.from_json`` ignores it, and the memory
#: answers as its preset does without the mechanism. The settings archived for each past version
#: (tests/data/preset_versions.json) keep their values; tests/test_presets.py compares the fields
#: ``Preset`` still has and checks that every other archived field is listed here.
_RERANK = ("the rerank (the model read the vote's leading replies and rescaled their weights, versions "
           "8-12) was removed: the ablation on dev rows measured no gain for it, at over a third of a "
           "reply's time (docs/method.md, Ablation)")
_RECOVERY = ("recovery (after a generated token no steering answer had, answers that began with the "
             "generated first token and differed in at most one token per 8 positions kept steering; versions "
             "6-12) was removed: on dev rows it changed no answer, greedy or sampled at temperature 0.8, on "
             "labels or replies, on either model (docs/method.md, Ablation)")
RETIRED_FIELDS: dict[str, str] = {
    "recover": _RECOVERY,
    "rerank_lambda": _RERANK,
    "rerank_top": _RERANK,
    "rerank_min_tokens": _RERANK + "; its other use, the whitening's reply length, is key_whitening.REPLY_MIN_TOKENS",
    "rerank_score": _RERANK,
}


def preset_names() -> list[str]:
    """The presets a user selects: each name, at its current version. Earlier versions stay
    readable for the memories built with them (``Preset.from_json``); ``preset_version`` makes one
    for code that must reproduce such a memory (the benchmark harness)."""
    return list(PRESETS)


def get_preset(name: str) -> Preset:
    """A preset by name: ``default`` or ``paper``, at its current version."""
    if name not in PRESETS:
        raise InputError(f"unknown preset {name!r}; known: {', '.join(preset_names())}")
    return PRESETS[name]()


def preset_version(name: str, version: int) -> Preset:
    """A named preset as it was at ``version`` (what a memory built then keeps)."""
    p = _at_version(name, version)
    if p is None:
        raise InputError(f"unknown preset {name!r} version {version!r}")
    return p


def _at_version(name: str, version) -> Preset | None:
    """Today's preset ``name`` with a past version's differences applied; None: no such version."""
    if name not in PRESETS:
        return None
    p = PRESETS[name]()
    if version == p.version:
        return p
    diff = PAST_VERSIONS.get((name, version)) if isinstance(version, int) else None
    if diff is None:
        return None
    for k, v in diff.items():
        if isinstance(v, dict):
            for kk, vv in v.items():
                setattr(getattr(p, k), kk, vv)
        else:
            setattr(p, k, tuple(v) if isinstance(v, list) else v)
    p.version = version
    return p


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
