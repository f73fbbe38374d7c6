"""Presets: every setting that decides how experiences become answers, as one value.

A memory stores its preset (only what differs from the named one) in its manifest, so whoever
opens it later answers with the settings it was built with.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..errors import InputError, StoreError
from ..memory.bank import BankConfig
from .retrieval import RetrievalConfig

__all__ = ["PRESETS", "Preset", "default_preset", "get_preset", "paper_preset"]


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

    def to_json(self) -> dict:
        """Only what differs from the named preset (the manifest is counted in the budget)."""
        full, base = asdict(self), asdict(PRESETS[self.name]()) if self.name in PRESETS else {}
        out = {"name": self.name}
        for k, v in full.items():
            if isinstance(v, dict):
                diff = {kk: vv for kk, vv in v.items() if base.get(k, {}).get(kk) != vv}
                if diff:
                    out[k] = diff
            elif k != "name" and base.get(k) != v:
                out[k] = v
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Preset":
        if d.get("name") not in PRESETS:
            raise StoreError(f"unknown preset {d.get('name')!r} in memory manifest")
        p = PRESETS[d["name"]]()
        for k, v in d.items():
            if k == "name":
                continue
            if isinstance(v, dict):
                sub = getattr(p, k)
                for kk, vv in v.items():
                    setattr(sub, kk, vv)
            else:
                setattr(p, k, v)
        p.bank.validate()
        p.retrieval.validate()
        return p

    def describe(self) -> dict:
        return asdict(self)


def paper_preset() -> Preset:
    """Section 3 as written: one averaged direction per experience, max-anchor
    semantic score + uncertainty rerank, softmax aggregation, gated addition.
    η: the paper's 0.5 is absolute on Qwen3; here η is relative to ‖h_q‖, and
    0.2 was the best of 0.05/0.1/0.2/0.4 on Banking77 stage 1 (docs/method.md §7)."""
    return Preset("paper", BankConfig(payload="mean", dir_precision="float32", key_precision="float32"),
                  skip_bos=False, center_keys=False, aggregation="paper", eta=0.2)


def default_preset() -> Preset:
    """Our default; every choice is measured in docs/method.md."""
    return Preset("default", BankConfig(payload="tokens", key_precision="bit"),
                  skip_bos=True, center_keys=True, aggregation="prefix", k_anchors=8,
                  retrieval=RetrievalConfig(T_agg=0.02), eta=0.3)


PRESETS = {"paper": paper_preset, "default": default_preset}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise InputError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]()
