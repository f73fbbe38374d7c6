"""A bank's settings and its one unit: the prototype (payload, answer tokens, anchors and counts).

What each setting means, and the choices the paper leaves open, are in ``memory.bank``'s doc.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import codecs

PAYLOADS = ("mean", "sequence", "tokens")
ANCHOR_FOLDS = ("closest", "ward")
NARROW_RULES = ("prefix", "balanced", "balanced-shared", "rival-shared")
#: With ``narrow_rule = "balanced-shared"``, a coordinate among the frame's first SHARED_SPAN that a
#: narrowing drops stays in every key as one bit the memory stores once (the answers' majority sign):
#: chosen on Banking77's dev rows among 128, 256, 512 and every coordinate (a probe,
#: docs/results/candidates/balanced-bits.md), the fewest bytes (at most 16).
SHARED_SPAN = 128
TOKEN_END = -1  # separator after each prototype's answer tokens in the flat 'tokens' array
#: Between two taught inputs in one prototype's evidence: the largest 3-byte id, which no
#: vocabulary reaches (evidence is stored as 3-byte token ids).
EVIDENCE_SEP = (1 << 24) - 1


#: Narrowest key a repair may shrink 1-bit keys to (bits), where a preset does not say
#: (``BankConfig.min_key_bits``): what the defaults of versions 13 to 21 narrowed to. The default's own floor
#: is ``method.presets.NARROW_FLOOR``.
MIN_KEY_BITS = 96
#: A prototype's radius as stored: floor(cos · RADIUS_SCALE) in int8, so the stored value never
#: exceeds the measured one (the gate can only become more permissive, never stricter, by rounding).
RADIUS_SCALE = 127


@dataclass
class BankConfig:
    payload: str = "mean"
    dir_precision: str = "float32"
    key_precision: str = "float32"
    tau_d: float = 0.85
    tau_k: float = 0.80
    tau_merge: float = 0.5
    # Keep each prototype's radius (``Prototype.radius``) for the relevance gate: one byte each.
    relevance: bool = False
    # Repair may narrow 1-bit keys (drop their last coordinates) before it evicts a prototype.
    shrink_keys: bool = False
    # Which anchors repair folds first: "closest" (the paper's redundant anchor: the closest pair of
    # one prototype, folded into its nearest sibling) or "ward" (the pair whose fold distorts the
    # keys they stand for least, n_a·n_b/(n_a+n_b)·‖a − b‖², as eq. 5's merge measures prototypes).
    anchor_fold: str = "closest"
    # Which coordinates narrowing drops: "prefix", the frame's last ones (a narrowed key is the
    # stored key's prefix); or "balanced", those whose bits the memory's answers share most (a
    # coordinate every answer has the same sign in tells none apart), the kept set then stored; or
    # "balanced-shared", "balanced" with the dropped ones among the first SHARED_SPAN kept in every
    # key as one shared bit each, stored once (they tell the memory's questions from others); or
    # "rival-shared", the same with a coordinate's worth taken from how often an answer's bit there
    # differs from its nearest rival's, not from all answers' balance.
    narrow_rule: str = "prefix"
    # Keep the input's tokens of an answer taught once (``Prototype.evidence``), so that the model can
    # read a query against it where the paraphrase reach alone would trust that answer (method/verify).
    evidence: bool = False
    # How many distinct taught inputs an answer keeps as its evidence: an answer taught by more lets
    # them go, and its radius judges it (``joined_evidence``). 1: only an answer taught once keeps its.
    evidence_inputs: int = 1
    # The narrowest key repair may shrink 1-bit keys to (bits, a multiple of 8: keys narrow by whole
    # bytes); below it repair merges and evicts instead. A preset's field, not only a module constant,
    # so that a memory records the floor it was narrowed under and the ablation can compare floors.
    min_key_bits: int = MIN_KEY_BITS

    def validate(self) -> None:
        if isinstance(self.min_key_bits, bool) or not isinstance(self.min_key_bits, int) \
                or self.min_key_bits < 8 or self.min_key_bits % 8:
            raise ValueError(f"min_key_bits must be a positive multiple of 8 (keys narrow by whole bytes), "
                             f"got {self.min_key_bits!r}")
        if not isinstance(self.evidence, bool):
            raise ValueError(f"evidence must be true or false, got {self.evidence!r}")
        if isinstance(self.evidence_inputs, bool) or not isinstance(self.evidence_inputs, int) \
                or not 1 <= self.evidence_inputs <= 2:
            raise ValueError(f"evidence_inputs must be 1 or 2, got {self.evidence_inputs!r}")
        if self.payload not in PAYLOADS:
            raise ValueError(f"payload must be one of {PAYLOADS}")
        if self.dir_precision not in codecs.DIR_PRECISIONS:
            raise ValueError(f"dir_precision must be one of {codecs.DIR_PRECISIONS}")
        if self.key_precision not in codecs.KEY_PRECISIONS:
            raise ValueError(f"key_precision must be one of {codecs.KEY_PRECISIONS}")
        if self.anchor_fold not in ANCHOR_FOLDS:
            raise ValueError(f"anchor_fold must be one of {ANCHOR_FOLDS}")
        if self.narrow_rule not in NARROW_RULES:
            raise ValueError(f"narrow_rule must be one of {NARROW_RULES}")
        for name in ("tau_d", "tau_k", "tau_merge"):
            v = getattr(self, name)
            if not -1.0 <= v <= 1.0:
                raise ValueError(f"{name} must be a cosine in [-1, 1], got {v}")


class Prototype:
    """One prototype: its payload, its answer tokens and its anchors (keys) with their counts.

    ``dirs`` (L', H) float32 unit rows as stored (decoded); L' = 1 (mean), L (sequence), 0 (tokens).
    ``tokens`` (L,) int32 answer tokens (empty for 'mean'). ``anchors`` (a, H) float32 keys as
    stored (decoded). ``anchor_n`` (a,) how many keys each anchor stands for (stored).
    ``anchor_sum`` (a, H) the sum of those prepared keys (RAM only; see ``_fold``).

    ``anchor_sum`` is only read when the bank changes (ingest, repair), so a prototype loaded
    from the store derives it on first use — unit anchor × count, the best estimate from the
    stored form — instead of at load: a memory opened to answer questions then holds one float
    copy of its anchors, not two (the peak memory of ``ask``). Replacing ``anchors`` or
    ``anchor_n`` first fixes the estimate from the values being replaced, so the lazy value is
    always the one an eager load would have computed.
    """

    def __init__(self, dirs: np.ndarray, tokens: np.ndarray, anchors: np.ndarray, n: int = 1,
                 anchor_n: np.ndarray | None = None, anchor_sum: np.ndarray | None = None,
                 radius: float = 1.0, evidence: np.ndarray | None = None) -> None:
        self.dirs = dirs
        self.tokens = tokens
        self._anchors = anchors
        self.n = n
        self._anchor_n = np.ones(len(anchors), np.int64) if anchor_n is None else anchor_n
        self._anchor_sum = anchor_sum
        # The lowest similarity (stored key against stored anchors) with which one of this
        # answer's examples joined the anchors it already had: how far apart its own examples
        # are. 1.0 until a second example arrives (then only an exact repeat is "as close").
        self.radius = radius
        # The tokens of the inputs that taught this answer, while it holds every distinct one of them
        # (``BankConfig.evidence_inputs`` at most; several are joined by EVIDENCE_SEP: ``evidence_inputs``;
        # None: not kept, or taught by more since): what method/verify reads a query against. Repair
        # drops it first.
        self.evidence = evidence

    def __repr__(self) -> str:
        return (f"Prototype(n={self.n}, tokens={list(self.tokens)}, dirs={self.dirs.shape}, "
                f"anchors={self.anchors.shape})")

    @property
    def anchors(self) -> np.ndarray:
        return self._anchors

    @anchors.setter
    def anchors(self, value: np.ndarray) -> None:
        self._fix_sum()
        self._anchors = value

    @property
    def anchor_n(self) -> np.ndarray:
        return self._anchor_n

    @anchor_n.setter
    def anchor_n(self, value: np.ndarray) -> None:
        self._fix_sum()
        self._anchor_n = value

    @property
    def anchor_sum(self) -> np.ndarray:
        self._fix_sum()
        return self._anchor_sum

    @anchor_sum.setter
    def anchor_sum(self, value: np.ndarray) -> None:
        self._anchor_sum = value

    def _fix_sum(self) -> None:
        if self._anchor_sum is None:  # best estimate from the stored form: unit anchor × count
            a = self._anchors
            self._anchor_sum = (unit_rows(a) * self._anchor_n[:, None]).astype(np.float32) if len(a) \
                else np.zeros_like(a)


@dataclass
class WriteResult:
    action: str  # "new" | "merged"
    proto: int
    anchor_added: bool


@dataclass
class RepairLog:
    pruned: int = 0
    merged: int = 0
    evicted: int = 0
    narrowed: int = 0
    dropped: int = 0  # evidence let go (MemoryBank.drop_evidence)

    def __iadd__(self, other: "RepairLog") -> "RepairLog":
        self.dropped += other.dropped
        self.pruned += other.pruned
        self.merged += other.merged
        self.evicted += other.evicted
        self.narrowed += other.narrowed
        return self


def quantize_radius(c: float) -> float:
    """A radius as it is stored (and kept in RAM, so RAM mirrors disk): floor(c·127)/127."""
    return float(np.clip(np.floor(c * RADIUS_SCALE), -RADIUS_SCALE, RADIUS_SCALE)) / RADIUS_SCALE


def unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(n, 1e-12)


def cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(a @ b) / (na * nb)



def uint_for(maxval: int):
    """The narrowest unsigned dtype that holds ``maxval``."""
    return np.uint8 if maxval < 1 << 8 else np.uint16 if maxval < 1 << 16 else np.uint32


def evidence_inputs(evidence: np.ndarray | None) -> list[np.ndarray]:
    """The taught inputs one prototype's ``evidence`` holds (split at EVIDENCE_SEP); [] for None."""
    if evidence is None:
        return []
    ev = np.asarray(evidence, np.int32).reshape(-1)
    parts = np.split(ev, np.flatnonzero(ev == EVIDENCE_SEP))  # every part after the first opens with the separator
    return [part[1:] if i else part for i, part in enumerate(parts)]


def joined_evidence(held: np.ndarray | None, new: np.ndarray | None, most: int) -> np.ndarray | None:
    """A prototype's evidence after one more example of its answer, whose input's tokens are ``new``:
    unchanged where ``new`` is one of the inputs held already (the same question taught again);
    ``new`` joined on where fewer than ``most`` are held; else None, as where either side holds
    nothing: an answer keeps its inputs only while it holds every distinct one, so that the model
    reads a query against all the ways it was taught, or the radius judges it."""
    if held is None or new is None or not len(new):
        return None
    new = np.asarray(new, np.int32).reshape(-1)
    inputs = evidence_inputs(held)
    if any(np.array_equal(x, new) for x in inputs):
        return held
    if len(inputs) >= most:
        return None
    return np.concatenate([np.asarray(held, np.int32).reshape(-1), [EVIDENCE_SEP], new]).astype(np.int32)
