"""Where a memory's bytes go: one committed version split into keys, answers, vectors and framing,
and which of a stream's answers the memory still holds.

Why: under a tight budget (1% of Banking77's stream is 2.4 KB) repair decides what survives, and a
change to the mechanism needs to know first what the budget is spent on. The split is read from the
stored arrays and the manifest with the store's own layout arithmetic (``store_format.layout``), so
its parts add up to exactly the bytes the budget counts (``encoded_size``); :func:`account` checks
that before it returns.

Parts (by stored array; docs/results/bytes.md):

* ``keys``: the anchors' key bits (``anchors``, ``anchor_scale`` for int8 keys, and ``key_kept``, which
  coordinates a balanced narrowing kept). An anchor that
  stands for more than one key (``anchor_count`` > 1) is a centroid that repair folded; its bytes
  are also reported apart as ``centroid_keys`` (a share of ``keys``, not a fifth part).
* ``answers``: the stored answer tokens (the dictionary, ``tok_ids`` or ``tok_dict`` and ``tok_dict3``;
  ``tok_idx``, or ``tok_bits``, the indices and the answers' lengths as one bit stream; earlier
  memories' ``tok3``, or format 1's ``tokens``).
* ``vectors``: payload directions (``dirs``, ``dir_scale``); none for the ``tokens`` payload.
* ``framing``: the file header, the manifest (compact JSON), alignment padding, and the
  per-record arrays that index the rest (``anchor_per``, ``anchor_count``, ``counts``,
  ``tok_len``, ``radius``, format 1's ``anchor_owner``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Mapping, Sequence

import numpy as np

from .store_format import encode_meta, encoded_size, layout, ordered_specs

__all__ = ["ARRAY_PARTS", "PARTS", "ByteAccount", "Coverage", "account", "answer_coverage"]

PARTS = ("keys", "answers", "vectors", "framing")
#: Each stored array's part; an array not named here is framing (an index or a count).
ARRAY_PARTS = {"anchors": "keys", "anchor_scale": "keys", "key_kept": "keys",
               "tok_ids": "answers", "tok_dict": "answers", "tok_dict3": "answers", "tok_idx": "answers", "tok_bits": "answers",
               "tok3": "answers", "tokens": "answers",
               "dirs": "vectors", "dir_scale": "vectors"}


@dataclass(frozen=True)
class ByteAccount:
    """One version's bytes. ``parts`` (PARTS) add up to ``total``; ``framing`` splits that part
    into ``header``, ``manifest``, ``padding`` and each per-record array by name; ``arrays`` is
    every array's payload bytes; ``centroid_keys`` the key bytes of anchors standing for > 1 key."""

    total: int
    parts: dict[str, int]
    framing: dict[str, int]
    arrays: dict[str, int]
    centroid_keys: int


def account(arrays: Mapping[str, np.ndarray], manifest: dict, fmt: int | None = None) -> ByteAccount:
    """The bytes of the version ``arrays`` + ``manifest`` would be (or is) on disk, by part, laid
    out in format ``fmt``: a committed version's own (``Snapshot.format_version``), or by default
    the format the next commit writes.

    Raises AssertionError if the parts do not add up to ``encoded_size`` (the budget's count)."""
    specs = ordered_specs(dict(arrays))
    meta = encode_meta(manifest)
    header, entries, total = layout(specs, meta, fmt)
    framing = {"header": len(header) - len(meta), "manifest": len(meta), "padding": 0}
    sizes: dict[str, int] = {}
    end = len(header)
    for e in entries:
        if e.nbytes:
            framing["padding"] += e.offset - end
            end = e.offset + e.nbytes
        sizes[e.name] = e.nbytes
    parts = dict.fromkeys(PARTS, 0)
    for name, n in sizes.items():
        part = ARRAY_PARTS.get(name, "framing")
        parts[part] += n
        if part == "framing":
            framing[name] = n
    parts["framing"] += framing["header"] + framing["manifest"] + framing["padding"]
    counted = encoded_size(dict(arrays), manifest, fmt)
    if not sum(parts.values()) == total == counted:  # a check that stays under python -O
        raise AssertionError(f"byte parts {parts} add up to {sum(parts.values())}, the store counts {counted}")
    return ByteAccount(total, parts, framing, sizes, _centroid_key_bytes(arrays))


def _centroid_key_bytes(arrays: Mapping[str, np.ndarray]) -> int:
    """Key bytes (row bits and any per-row scale) of the anchors that stand for more than one key."""
    if "anchors" not in arrays:
        return 0
    # without anchor_count each prototype's one anchor stands for its count (bank_arrays)
    counts = arrays.get("anchor_count", arrays.get("counts"))
    if counts is None:
        return 0
    raw = np.asarray(arrays["anchors"])
    row = raw.dtype.itemsize * int(np.prod(raw.shape[1:], dtype=np.int64))
    if "anchor_scale" in arrays:
        row += np.asarray(arrays["anchor_scale"]).dtype.itemsize
    return row * int(np.count_nonzero(np.asarray(counts) > 1))


@dataclass(frozen=True)
class Coverage:
    """Which of a stream's distinct answers a memory holds. ``per_answer[a]`` is (prototypes,
    anchors) of answer ``a`` (0, 0 when it lost them all); the means and maxima are over the kept
    answers (0 when none is kept). ``foreign`` counts prototypes whose answer is not in the stream."""

    answers: int
    kept: int
    per_answer: dict
    protos_mean: float
    protos_max: int
    anchors_mean: float
    anchors_max: int
    foreign: int

    @property
    def lost(self) -> int:
        return self.answers - self.kept


def answer_coverage(proto_answers: Sequence[Hashable], proto_anchors: Sequence[int],
                    stream_answers: Sequence[Hashable]) -> Coverage:
    """Each distinct answer of ``stream_answers`` with the prototypes whose stored answer it is
    (``proto_answers[j]``, any hashable: token tuples, texts) and their anchors (``proto_anchors[j]``).

    Answers are compared as given: the caller maps stored tokens and stream texts to one form."""
    if len(proto_answers) != len(proto_anchors):
        raise ValueError(f"{len(proto_answers)} prototype answers but {len(proto_anchors)} anchor counts")
    per = {a: (0, 0) for a in dict.fromkeys(stream_answers)}
    foreign = 0
    for ans, n_anchors in zip(proto_answers, proto_anchors):
        if ans not in per:
            foreign += 1
            continue
        p, a = per[ans]
        per[ans] = (p + 1, a + int(n_anchors))
    kept = [v for v in per.values() if v[0] > 0]
    protos = [p for p, _ in kept]
    anchors = [a for _, a in kept]
    return Coverage(len(per), len(kept), per, float(np.mean(protos)) if kept else 0.0, max(protos, default=0),
                    float(np.mean(anchors)) if kept else 0.0, max(anchors, default=0), foreign)
