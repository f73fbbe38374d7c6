"""The direction memory: prototypes, their anchors, and budget repair (eqs. 3–5).

A prototype ``u_j = (d_j, A_j, n_j)`` holds a correction payload, a set of
semantic anchors (keys) and the number of experiences merged into it. The
payload has one of three forms (``BankConfig.payload``):

- ``mean``     — one unit direction per prototype, the paper's d_j (eq. 2);
- ``sequence`` — one unit direction per answer position s, d_{j,s} =
                 Norm(W_LMᵀ(e_{y_s} − p_s)), plus the answer tokens y_{j,·};
- ``tokens``   — the answer tokens only; at ask time d_{j,s} = Norm(W_LM[y_s]),
                 read from the model, so it costs no memory bytes.

Choices the paper leaves open (docs/method.md has the reasons):

- *Direction similarity* of two prototypes: ``mean``: cos(d_a, d_b);
  ``sequence``: Σ_s cos(d_{a,s}, d_{b,s}) / max(L_a, L_b) over aligned
  positions; ``tokens``: the fraction of aligned positions with equal tokens.
- *Assignment* (eq. 3): to the most similar prototype if similarity ≥ τ_d; for
  ``sequence`` and ``tokens`` only when the token sequences are equal as well,
  because averaging directions that push different tokens yields neither.
- *Anchor novelty* (eq. 4) is measured between stored (decoded) keys.
- *Repair*: (1) prune the most redundant anchor — in a prototype with ≥ 2
  anchors, of the pair of anchors with the highest cosine, the one more
  similar to the rest is folded into its nearest sibling (their keys' sum
  becomes the survivor, so pruned anchors condense into centroids); with
  ``anchor_fold="ward"`` (the default preset since version 3) the pair whose
  fold costs least in Ward's criterion folds instead; (2) merge the
  pair of prototypes with the smallest Ward distortion
  n_a·n_b/(n_a+n_b)·‖d_a − d_b‖², if their similarity ≥ τ_merge and their
  payloads may be merged (same rule as assignment); (3) evict the prototype
  of lowest value (eq. 5). Size(u_j) counts its payload, anchors, owner
  indices and count bytes; with J = 1 the max over r ≠ j is taken as 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import codecs
from ..errors import BudgetError
from ..native import ext

PAYLOADS = ("mean", "sequence", "tokens")
ANCHOR_FOLDS = ("closest", "ward")
TOKEN_END = -1  # separator after each prototype's answer tokens in the flat 'tokens' array


#: Narrowest key a repair may shrink 1-bit keys to (bits): below this the vote is noise.
MIN_KEY_BITS = 32
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

    def validate(self) -> None:
        if self.payload not in PAYLOADS:
            raise ValueError(f"payload must be one of {PAYLOADS}")
        if self.dir_precision not in codecs.DIR_PRECISIONS:
            raise ValueError(f"dir_precision must be one of {codecs.DIR_PRECISIONS}")
        if self.key_precision not in codecs.KEY_PRECISIONS:
            raise ValueError(f"key_precision must be one of {codecs.KEY_PRECISIONS}")
        if self.anchor_fold not in ANCHOR_FOLDS:
            raise ValueError(f"anchor_fold must be one of {ANCHOR_FOLDS}")
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
    copy of its anchors, not two (peak memory of ``ask``, issue 15). Replacing ``anchors`` or
    ``anchor_n`` first fixes the estimate from the values being replaced, so the lazy value is
    always the one an eager load would have computed.
    """

    def __init__(self, dirs: np.ndarray, tokens: np.ndarray, anchors: np.ndarray, n: int = 1,
                 anchor_n: np.ndarray | None = None, anchor_sum: np.ndarray | None = None,
                 radius: float = 1.0) -> None:
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
            self._anchor_sum = (_unit_rows(a) * self._anchor_n[:, None]).astype(np.float32) if len(a) \
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

    def __iadd__(self, other: "RepairLog") -> "RepairLog":
        self.pruned += other.pruned
        self.merged += other.merged
        self.evicted += other.evicted
        self.narrowed += other.narrowed
        return self


def quantize_radius(c: float) -> float:
    """A radius as it is stored (and kept in RAM, so RAM mirrors disk): floor(c·127)/127."""
    return float(np.clip(np.floor(c * RADIUS_SCALE), -RADIUS_SCALE, RADIUS_SCALE)) / RADIUS_SCALE


def _unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(n, 1e-12)


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(a @ b) / (na * nb)


class MemoryBank:
    """Prototypes in RAM; ``to_arrays``/``from_arrays`` convert to the stored form.

    Mutating methods say so. Vectors are kept as their stored (decoded) values.
    """

    def __init__(self, config: BankConfig, n_embd: int, key_mean: np.ndarray | None = None,
                 key_parts: int = 1, key_order: np.ndarray | None = None, key_dim: int | None = None):
        config.validate()
        self.config = config
        self.n_embd = int(n_embd)
        self._protos: list[Prototype] | None = []
        self._stored: _Stored | None = None  # a bank opened from the store, before its Prototypes exist
        # A key is ``key_parts`` blocks of n_embd values (one per key layer), each centred and
        # brought to unit norm on its own so no layer dominates the cosine.
        self.key_parts = int(key_parts)
        full = self.n_embd * self.key_parts
        # Centring vector for keys (stored as float16); None: keys are not centred.
        self.key_mean = None if key_mean is None else np.asarray(key_mean, np.float16).astype(np.float32)
        if self.key_mean is not None and self.key_mean.shape != (full,):
            raise ValueError(f"key_mean has shape {self.key_mean.shape}, expected ({full},)")
        # The order in which a key's coordinates are kept (derived from the model, not stored):
        # a narrowed key keeps the first key_dim of them. None: index order.
        self.key_order = None if key_order is None else np.asarray(key_order, np.int64)
        if self.key_order is not None and sorted(self.key_order.tolist()) != list(range(full)):
            raise ValueError(f"key_order is not a permutation of the {full} key coordinates")
        # Coordinates a stored key keeps now (repair may narrow 1-bit keys, never widen them).
        self.key_dim = full if key_dim is None else int(key_dim)
        if not 0 < self.key_dim <= full:
            raise ValueError(f"key width {self.key_dim} outside 1..{full}")

    @property
    def protos(self) -> list[Prototype]:
        """The prototypes, in order. A bank opened by ``from_arrays`` makes these Python objects on
        first use, not at open: 1,000,000 of them take ~14 s, while answering needs only the views
        below, which read the stored arrays directly (issue 15)."""
        if self._protos is None:
            self._protos = self._stored.prototypes()
            self._stored = None
        return self._protos

    @protos.setter
    def protos(self, value: list[Prototype]) -> None:
        self._protos, self._stored = list(value), None

    # ------------------------------------------------------------ views
    @property
    def n_prototypes(self) -> int:
        return self._stored.J if self._protos is None else len(self._protos)

    @property
    def n_anchors(self) -> int:
        return len(self._stored.owner) if self._protos is None else sum(len(p.anchors) for p in self._protos)

    def anchor_matrix(self) -> tuple[np.ndarray, np.ndarray]:
        """All anchors (A, H) float32 and their owner prototype index (A,)."""
        if self._protos is None:
            return self._stored.anchors(), self._stored.owner_sorted()
        if not self.protos:
            return np.zeros((0, self.key_dim), np.float32), np.zeros(0, np.int64)
        A = np.concatenate([p.anchors for p in self.protos])
        owner = np.concatenate([np.full(len(p.anchors), j) for j, p in enumerate(self.protos)])
        return A, owner

    def anchor_owner(self) -> np.ndarray:
        """The owner prototype of each row of ``anchor_matrix()`` (A,) int64, without the matrix."""
        if self._protos is None:
            return self._stored.owner_sorted()
        if not self._protos:
            return np.zeros(0, np.int64)
        return np.concatenate([np.full(len(p.anchors), j) for j, p in enumerate(self._protos)])

    def packed_anchors(self) -> np.ndarray:
        """The rows of ``anchor_matrix()`` as packed sign bits (A, ceil(H/8)) uint8: for 1-bit keys
        exactly the stored bytes (read in place when the bank was just opened)."""
        if self._protos is None:
            if self.config.key_precision == "bit":
                return self._stored.packed_sorted()
            return np.packbits(self._stored.anchors() >= 0, axis=1)
        if not self.protos:
            return np.zeros((0, (self.key_dim + 7) // 8), np.uint8)
        return np.concatenate([np.packbits(p.anchors >= 0, axis=1) for p in self.protos])

    def counts(self) -> np.ndarray:
        """Each prototype's n, the examples written into it (J,) int64."""
        if self._protos is None:
            return self._stored.counts.astype(np.int64)
        return np.array([p.n for p in self._protos], np.int64)

    def radii(self) -> np.ndarray:
        """Each prototype's radius as a cosine (J,) float64 (1.0: no second example yet)."""
        if self._protos is None:
            return self._stored.radii()
        return np.array([p.radius for p in self._protos], np.float64)

    def anchor_counts(self) -> np.ndarray:
        """How many keys each row of ``anchor_matrix()`` stands for (A,) int64."""
        if self._protos is None:
            a = self._stored.acount
            return (a if self._stored.sorted else a[self._stored.by_owner]).astype(np.int64)
        if not self._protos:
            return np.zeros(0, np.int64)
        return np.concatenate([p.anchor_n for p in self._protos]).astype(np.int64)

    def max_token(self) -> int:
        """The largest stored answer token id (-1 without any): checked against the model's vocabulary."""
        if self._protos is None:
            flat = self._stored.seqs().flat
            return int(flat.max()) if len(flat) else -1
        return max((int(p.tokens.max()) for p in self._protos if len(p.tokens)), default=-1)

    def answer_tokens(self):
        """Each prototype's answer tokens (a sequence of int32 arrays, indexable by prototype)."""
        if self._protos is None:
            return self._stored.seqs()
        return [p.tokens for p in self._protos]

    def directions(self, position: int = 0) -> np.ndarray:
        """(J, H) direction of each prototype at an answer position (zeros where absent)."""
        if self._protos is None:
            return self._stored.directions(position)
        D = np.zeros((len(self.protos), self.n_embd), np.float32)
        for j, p in enumerate(self.protos):
            if position < len(p.dirs):
                D[j] = p.dirs[position]
        return D

    def prepare_key(self, key: np.ndarray) -> np.ndarray:
        """Raw mean-pooled key -> the vector that is compared and stored: centred, each layer's
        block at unit norm, its coordinates in ``key_order``, the first ``key_dim`` kept, unit."""
        k = np.asarray(key, np.float32)
        if k.shape != (self.n_embd * self.key_parts,):
            raise ValueError(f"key has shape {k.shape}, expected ({self.n_embd * self.key_parts},)")
        if self.key_mean is not None:
            k = k - self.key_mean
        if self.key_parts > 1:
            blocks = k.reshape(self.key_parts, self.n_embd)
            k = (blocks / np.maximum(np.linalg.norm(blocks, axis=1, keepdims=True), 1e-12)).reshape(-1)
        if self.key_order is not None:
            k = k[self.key_order]
        k = k[:self.key_dim]
        n = np.linalg.norm(k)
        return k / n if n > 0 else k

    def prepare_query(self, key: np.ndarray, rows=None) -> np.ndarray:
        """``prepare_key`` for a query, as float32, in one native call: the same centring (float32,
        so the signs a 1-bit memory compares are those ``prepare_key`` gives), block norms, order
        and cut, with the norms taken in double (agrees with ``prepare_key`` to float32 rounding).
        ``rows``: ``key`` is the callback's sums (``QueryState.key_sum``) and ``rows`` each block's
        row count (``pooled_rows``; one count for all blocks, 0 as 1), divided as
        ``key_pooling.key_mean`` divides, bitwise.
        Retrieval calls it once per answer, right after a prompt pass, when each numpy step costs
        several microseconds of cold caches (issue 15)."""
        k = np.asarray(key, np.float32)
        if k.shape != (self.n_embd * self.key_parts,):
            raise ValueError(f"key has shape {k.shape}, expected ({self.n_embd * self.key_parts},)")
        return ext.prepare_query(k, self.key_parts, self.key_mean, self.key_order, self.key_dim, rows)

    def store_key(self, key: np.ndarray) -> np.ndarray:
        """What a prepared key becomes on disk (decoded), shape (1, H)."""
        return codecs.roundtrip(key[None], self.config.key_precision)

    # ------------------------------------------------------------ similarity
    def similarity(self, a: Prototype, b: Prototype) -> float:
        pay = self.config.payload
        if pay == "mean":
            return _cos(a.dirs[0], b.dirs[0])
        L = max(len(a.tokens), len(b.tokens))
        if L == 0:
            return 0.0
        m = min(len(a.tokens), len(b.tokens))
        if pay == "tokens":
            return float(np.sum(a.tokens[:m] == b.tokens[:m])) / L
        return float(sum(_cos(a.dirs[s], b.dirs[s]) for s in range(m))) / L

    def _mergeable(self, a: Prototype, b: Prototype) -> bool:
        if self.config.payload == "mean":
            return True
        return len(a.tokens) == len(b.tokens) and bool(np.all(a.tokens == b.tokens))

    # ------------------------------------------------------------ write (eqs. 3, 4)
    def write(self, dirs: np.ndarray, tokens: np.ndarray, key: np.ndarray) -> WriteResult:
        """Mutates: add one experience. ``dirs`` unnormalised rows (mean: 1 row;
        sequence: one per token; tokens: ignored); ``key`` the raw pooled key."""
        pay = self.config.payload
        tokens = np.asarray(tokens, np.int32).reshape(-1)
        if pay == "mean":
            d = codecs.roundtrip(_unit_rows(np.asarray(dirs).reshape(1, -1)), self.config.dir_precision)
            tokens = np.zeros(0, np.int32)
        elif pay == "sequence":
            d = codecs.roundtrip(_unit_rows(dirs), self.config.dir_precision)
            if len(d) != len(tokens):
                raise ValueError("sequence payload needs one direction per answer token")
        else:
            d = np.zeros((0, self.n_embd), np.float32)
        kp = self.prepare_key(key)[None].astype(np.float32)
        k = self.store_key(kp[0])
        new = Prototype(d, tokens, k, 1, np.ones(1, np.int64), kp.copy())
        if self.protos:
            sims = [self.similarity(new, p) if self._mergeable(new, p) else -np.inf for p in self.protos]
            j = int(np.argmax(sims))
            if sims[j] >= self.config.tau_d:
                p = self.protos[j]
                if pay != "tokens":  # eq. 3, position-wise for sequences
                    merged = _unit_rows(p.n * p.dirs + new.dirs[0 if pay == "mean" else slice(None)])
                    p.dirs = codecs.roundtrip(merged, self.config.dir_precision)
                p.n += 1
                # stored anchors are unit-norm except 'bit' (±1): normalise both sides
                novel = self._max_anchor_cos(p.anchors, k[0])
                if self.config.relevance:
                    p.radius = min(p.radius, quantize_radius(novel))
                added = novel < self.config.tau_k
                if added:
                    p.anchors = np.concatenate([p.anchors, k])
                    p.anchor_n = np.append(p.anchor_n, 1)
                    p.anchor_sum = np.concatenate([p.anchor_sum, kp])
                return WriteResult("merged", j, added)
        self.protos.append(new)
        return WriteResult("new", len(self.protos) - 1, True)

    @staticmethod
    def _max_anchor_cos(anchors: np.ndarray, k: np.ndarray) -> float:
        if len(anchors) == 0:
            return -1.0
        num = anchors @ k
        den = np.linalg.norm(anchors, axis=1) * max(float(np.linalg.norm(k)), 1e-12)
        return float(np.max(num / np.maximum(den, 1e-12)))

    # ------------------------------------------------------------ sizes and value (eq. 5)
    def proto_bytes(self, p: Prototype) -> int:
        """Bytes this prototype adds to the stored arrays (its share of Size(B)), as ``to_arrays``
        lays them out now: payload, anchors with their uint16 counts, and one entry in each
        per-prototype array (anchors owned, count, answer length: the narrowest unsigned type of
        the bank's current largest value), answer tokens at 3 bytes, the radius byte."""
        cfg, H = self.config, self.n_embd
        isz = self._per_proto_itemsizes()
        b = len(p.dirs) * codecs.bytes_per_vector(cfg.dir_precision, H)
        b += len(p.anchors) * (codecs.bytes_per_vector(cfg.key_precision, self.key_dim) + 2)
        b += isz["per"] + isz["cnt"]
        if cfg.payload != "mean":
            b += 3 * len(p.tokens) + isz["len"]
        return b + (1 if cfg.relevance else 0)

    def _per_proto_itemsizes(self) -> dict[str, int]:
        protos = self.protos
        return {"per": np.dtype(_uint_for(max((len(q.anchors) for q in protos), default=0))).itemsize,
                "cnt": np.dtype(_uint_for(max((q.n for q in protos), default=0))).itemsize,
                "len": np.dtype(_uint_for(max((len(q.tokens) for q in protos), default=0))).itemsize}

    def values(self) -> np.ndarray:
        """value(u_j) = log(1+n_j)·(1 − max_{r≠j} sim(d_j, d_r)) / Size(u_j)   (eq. 5)."""
        J = len(self.protos)
        out = np.zeros(J)
        for j, p in enumerate(self.protos):
            mx = max((self.similarity(p, q) for r, q in enumerate(self.protos) if r != j), default=0.0)
            out[j] = np.log1p(p.n) * (1.0 - mx) / self.proto_bytes(p)
        return out

    # ------------------------------------------------------------ forgetting
    def forget_answer(self, tokens: np.ndarray) -> tuple[int, int, int]:
        """Mutates: remove every prototype whose stored answer is exactly ``tokens``, with the
        anchors it owns. Returns (prototypes removed, anchors removed, their write count n).

        Only for payloads that keep answers ('tokens', 'sequence'): there a prototype is only ever
        merged with one of the same answer (``_mergeable``), so each prototype carries exactly one
        answer, and the prototypes of other answers never depended on the removed ones (a write
        only compares against mergeable prototypes). A 'mean' prototype can merge several answers
        into one direction and keeps no tokens, so it cannot be forgotten by answer: ValueError.
        """
        if self.config.payload == "mean":
            raise ValueError("this memory's payload is 'mean': its prototypes keep no answer tokens and may each "
                             "merge several answers, so it cannot forget by answer")
        t = np.asarray(tokens, np.int32).reshape(-1)
        keep, gone = [], []
        for p in self.protos:
            (gone if len(p.tokens) == len(t) and bool(np.all(p.tokens == t)) else keep).append(p)
        self.protos = keep
        return len(gone), sum(len(p.anchors) for p in gone), sum(int(p.n) for p in gone)

    # ------------------------------------------------------------ repair
    def prune_one_anchor(self) -> bool:
        """Mutates: fold one anchor into another of its prototype, by ``config.anchor_fold``;
        False if no prototype has two anchors."""
        if self.config.anchor_fold == "ward":
            return self._fold_ward_pair()
        return self._fold_closest()

    def _fold_ward_pair(self) -> bool:
        """Fold the pair of anchors (within one prototype) whose union costs least in Ward's
        criterion: n_a·n_b/(n_a+n_b)·‖u_a − u_b‖² over the stored unit keys, n = the keys each
        anchor stands for. Why not the closest pair: a lone example far from its siblings is never
        the closest pair, so the paper's rule folds the dense middle of an answer again and again
        and keeps its outliers as anchors of their own, which then win other answers' queries
        (Banking77 at 20%: BWT -13.6 with the closest pair, -4.7 with Ward; docs/method.md §10.5).
        Ward's cost is small for a pair with a lone example, so outliers join a centroid first.
        The one standing for fewer keys folds into the other (ties: the later index); ties in
        cost go to the first prototype, then the first pair in row order."""
        best = (np.inf, -1, -1, -1)
        for j, p in enumerate(self.protos):
            if len(p.anchors) < 2:
                continue
            U = _unit_rows(p.anchors).astype(np.float64)
            n = np.asarray(p.anchor_n, np.float64)
            cost = (n[:, None] * n[None, :]) / (n[:, None] + n[None, :]) * np.maximum(2.0 - 2.0 * (U @ U.T), 0.0)
            cost[np.tril_indices(len(n))] = np.inf  # each pair once, never an anchor with itself
            r, c = np.unravel_index(int(np.argmin(cost)), cost.shape)
            if cost[r, c] < best[0]:
                best = (float(cost[r, c]), j, int(r), int(c))
        if best[1] < 0:
            return False
        p, r, c = self.protos[best[1]], best[2], best[3]
        victim, survivor = (r, c) if p.anchor_n[r] < p.anchor_n[c] else (c, r)
        self._fold_into(p, victim, survivor)
        return True

    def _fold_closest(self) -> bool:
        """Fold the most redundant anchor into its nearest sibling (the paper's rule, module doc).

        The closest pair of anchors within one prototype becomes one anchor
        standing for both: the survivor is the stored form of the normalised
        sum of the keys behind the two (a centroid), and its count is the sum
        of theirs. Dropping one of the pair instead loses what it saw; at
        4 KiB on Banking77 that kept one arbitrary example per label (39%
        exact) where centroids keep ~74% (docs/method.md). False if no
        prototype has two anchors.
        """
        best = (-np.inf, -1, -1)
        for j, p in enumerate(self.protos):
            a = len(p.anchors)
            if a < 2:
                continue
            U = _unit_rows(p.anchors)
            G = U @ U.T
            np.fill_diagonal(G, -np.inf)
            r, c = np.unravel_index(int(np.argmax(G)), G.shape)
            if G[r, c] > best[0]:
                # of the closest pair, remove the one closer to the rest on average
                G2 = np.where(np.isfinite(G), G, 0.0)
                victim = r if G2[r].sum() >= G2[c].sum() else c
                best = (float(G[r, c]), j, int(victim))
        if best[1] < 0:
            return False
        self.fold_anchor(self.protos[best[1]], best[2])
        return True

    def fold_anchor(self, p: Prototype, victim: int) -> None:
        """Mutates ``p``: fold anchor ``victim`` into its nearest sibling, which then stands for the
        keys of both (the stored form of their summed keys, their counts added)."""
        G = _unit_rows(p.anchors) @ _unit_rows(p.anchors[victim:victim + 1])[0]
        G[victim] = -np.inf
        self._fold_into(p, victim, int(np.argmax(G)))

    def _fold_into(self, p: Prototype, victim: int, survivor: int) -> None:
        """Mutates ``p``: anchor ``survivor`` stands for its keys and ``victim``'s, which goes."""
        p.anchor_sum[survivor] = p.anchor_sum[survivor] + p.anchor_sum[victim]
        p.anchor_n[survivor] += p.anchor_n[victim]
        p.anchors[survivor] = self.store_key(_unit_rows(p.anchor_sum[survivor]))[0]
        keep = np.arange(len(p.anchors)) != victim
        p.anchors, p.anchor_n, p.anchor_sum = p.anchors[keep], p.anchor_n[keep], p.anchor_sum[keep]

    def narrow_keys(self) -> bool:
        """Mutates: drop the last 8 coordinates of every stored key (1-bit keys only, with
        ``shrink_keys``); False at MIN_KEY_BITS or when not allowed.

        Why before merging and evicting: at a tight budget a narrower key keeps every answer
        retrievable, where an eviction loses one for good. The coordinates are in ``key_order``
        (the calibration keys' spread, highest first), so what goes is what varies least; with
        one centroid per label on Banking77, 640 -> 160 -> 80 bits of layer 12 kept 66 / 61 / 52%
        of the vote where index order kept 66 / 51 / 27% (docs/method.md). Sign bits need no
        original to narrow from, so this is exact: a narrowed key is the stored key's prefix."""
        cfg = self.config
        m = (self.key_dim - 1) // 8 * 8  # the next narrower multiple of 8 bits (whole stored bytes)
        if not cfg.shrink_keys or cfg.key_precision != "bit" or m < MIN_KEY_BITS:
            return False
        for p in self.protos:
            p.anchor_sum = p.anchor_sum[:, :m]
            p._anchors = p.anchors[:, :m]
        self.key_dim = m
        return True

    def merge_one_pair(self) -> bool:
        """Mutates: merge the pair of least Ward distortion if allowed; False if none."""
        best = (np.inf, -1, -1)
        J = len(self.protos)
        for a in range(J):
            pa = self.protos[a]
            for b in range(a + 1, J):
                pb = self.protos[b]
                if not self._mergeable(pa, pb) or self.similarity(pa, pb) < self.config.tau_merge:
                    continue
                if self.config.payload == "tokens":
                    dist = 0.0
                else:
                    diff = pa.dirs - pb.dirs
                    dist = pa.n * pb.n / (pa.n + pb.n) * float(np.sum(diff * diff))
                if dist < best[0]:
                    best = (dist, a, b)
        if best[1] < 0:
            return False
        _, a, b = best
        pa, pb = self.protos[a], self.protos[b]
        if self.config.payload != "tokens":
            pa.dirs = codecs.roundtrip(_unit_rows(pa.n * pa.dirs + pb.n * pb.dirs), self.config.dir_precision)
        pa.n += pb.n
        pa.radius = min(pa.radius, pb.radius)
        pa.anchors = np.concatenate([pa.anchors, pb.anchors])
        pa.anchor_n = np.concatenate([pa.anchor_n, pb.anchor_n])
        pa.anchor_sum = np.concatenate([pa.anchor_sum, pb.anchor_sum])
        del self.protos[b]
        return True

    def evict_one(self) -> int:
        """Mutates: remove the prototype of lowest value (ties: the oldest). Returns its index."""
        j = int(np.argmin(self.values()))
        del self.protos[j]
        return j

    def repair(self, budget: int, size_fn) -> RepairLog:
        """Mutates: repair until ``size_fn(self) <= budget`` in the paper's order.

        Raises BudgetError if even an empty-but-valid memory does not fit, or
        if the last prototype would have to go (the budget cannot hold one).
        """
        log = RepairLog()
        while size_fn(self) > budget:
            if self.prune_one_anchor():
                log.pruned += 1
            elif self.narrow_keys():
                log.narrowed += 1
            elif self.merge_one_pair():
                log.merged += 1
            elif len(self.protos) > 1:
                self.evict_one()
                log.evicted += 1
            else:
                raise BudgetError(f"budget of {budget} bytes cannot hold even one prototype "
                                  f"(the smallest memory needs {size_fn(self)} bytes)")
        return log

    # ------------------------------------------------------------ persistence
    def to_arrays(self, shapes_only: bool = False) -> dict[str, np.ndarray]:
        """The arrays that persist this bank. With ``shapes_only`` they are
        zero-cost broadcast views of the right shape/dtype (for exact sizing).

        Layout (every byte counts against the budget, so integers take the narrowest unsigned
        type their largest value fits): ``anchors`` grouped by prototype, ``anchor_per`` how many
        each prototype owns, ``anchor_count`` how many keys each anchor stands for, ``counts``
        each prototype's n, ``tok3`` the answer tokens as 3-byte little-endian ids (vocabularies
        up to 2^24) with ``tok_len`` per prototype, ``radius`` (relevance gate) in int8. Format 1
        memories (``anchor_owner``, int32 ``tokens`` with separators) are still read."""
        cfg, H, J = self.config, self.n_embd, len(self.protos)
        key_bytes_cols = codecs.bytes_per_vector("bit", self.key_dim) if cfg.key_precision == "bit" else self.key_dim
        A = self.n_anchors
        per = [len(p.anchors) for p in self.protos]
        lens = [len(p.tokens) for p in self.protos]
        out: dict[str, np.ndarray] = {}

        def fake(shape, dtype):
            return np.broadcast_to(np.zeros((), dtype), shape)

        kdt = {"float32": np.float32, "float16": np.float16, "int8": np.int8, "bit": np.uint8}
        per_dt, cnt_dt = _uint_for(max(per, default=0)), _uint_for(max((p.n for p in self.protos), default=0))
        len_dt = _uint_for(max(lens, default=0))
        if shapes_only:
            n_dirs = sum(len(p.dirs) for p in self.protos)
            if cfg.payload != "tokens":
                out["dirs"] = fake((n_dirs, H), kdt[cfg.dir_precision])
                if cfg.dir_precision == "int8":
                    out["dir_scale"] = fake((n_dirs,), np.float32)
            out["anchors"] = fake((A, key_bytes_cols), kdt[cfg.key_precision])
            if cfg.key_precision == "int8":
                out["anchor_scale"] = fake((A,), np.float32)
            out["anchor_per"] = fake((J,), per_dt)
            out["anchor_count"] = fake((A,), np.uint16)
            out["counts"] = fake((J,), cnt_dt)
            if cfg.payload != "mean":
                out["tok3"] = fake((sum(lens), 3), np.uint8)
                out["tok_len"] = fake((J,), len_dt)
            if cfg.relevance:
                out["radius"] = fake((J,), np.int8)
            return out

        if cfg.payload != "tokens":
            D = np.concatenate([p.dirs for p in self.protos]) if J else np.zeros((0, H), np.float32)
            enc = codecs.encode(D, cfg.dir_precision)
            out["dirs"] = enc["data"]
            if "scale" in enc:
                out["dir_scale"] = enc["scale"]
        Amat, _ = self.anchor_matrix()
        enc = codecs.encode(Amat, cfg.key_precision)
        out["anchors"] = enc["data"].reshape(A, key_bytes_cols)
        if "scale" in enc:
            out["anchor_scale"] = enc["scale"]
        out["anchor_per"] = np.array(per, per_dt)
        an = np.concatenate([p.anchor_n for p in self.protos]) if J else np.zeros(0, np.int64)
        out["anchor_count"] = np.minimum(an, 65535).astype(np.uint16)
        out["counts"] = np.array([p.n for p in self.protos], cnt_dt)
        if cfg.payload != "mean":
            flat = np.concatenate([p.tokens for p in self.protos]).astype(np.int64) if J else np.zeros(0, np.int64)
            if len(flat) and (flat.min() < 0 or flat.max() >= 1 << 24):
                raise ValueError("answer token ids must lie in 0..2^24-1 to be stored in 3 bytes")
            out["tok3"] = np.stack([(flat >> s) & 0xFF for s in (0, 8, 16)], axis=1).astype(np.uint8) \
                if len(flat) else np.zeros((0, 3), np.uint8)
            out["tok_len"] = np.array(lens, len_dt)
        if cfg.relevance:
            out["radius"] = np.array([np.floor(p.radius * RADIUS_SCALE + 1e-6) for p in self.protos],
                                     np.float64).clip(-RADIUS_SCALE, RADIUS_SCALE).astype(np.int8)
        return out

    @classmethod
    def from_arrays(cls, config: BankConfig, n_embd: int, arrays: dict[str, np.ndarray],
                    key_mean: np.ndarray | None = None, key_parts: int = 1,
                    key_order: np.ndarray | None = None) -> "MemoryBank":
        """Rebuild from stored arrays; raises ValueError on inconsistent arrays.

        ``key_mean`` and ``key_order`` are not stored: they derive from the model and template
        (see ``Miita``), so the caller passes them in again; the key width is the stored one.
        Every array is checked here; the Prototype objects are made on first use of ``protos``.
        """
        stored = _Stored(config, int(n_embd), int(key_parts), arrays)
        bank = cls(config, n_embd, key_mean, key_parts, key_order, stored.key_dim)
        bank._stored = stored
        bank._protos = None
        return bank


def _uint_for(maxval: int):
    """The narrowest unsigned dtype that holds ``maxval``."""
    return np.uint8 if maxval < 1 << 8 else np.uint16 if maxval < 1 << 16 else np.uint32


class _Seqs:
    """Each prototype's answer tokens as slices of a flat int32 array (indexable, sized)."""

    def __init__(self, flat: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        self.flat, self.starts, self.ends = flat, starts.astype(np.int64), ends.astype(np.int64)

    def __len__(self) -> int:
        return len(self.ends)

    def __getitem__(self, j: int) -> np.ndarray:
        return self.flat[self.starts[j]:self.ends[j]]


class _Stored:
    """A bank's stored arrays, checked, before its Prototype objects exist.

    The checks (and their messages) are the ones ``from_arrays`` always made; the views read the
    arrays with numpy (one pass each) instead of walking Prototype objects."""

    def __init__(self, config: BankConfig, H: int, key_parts: int, arrays: dict[str, np.ndarray]) -> None:
        self.config, self.H = config, H
        # A store accepts any valid arrays (a forged file with a recomputed checksum is valid), so the
        # ranks are checked here: a 2-D tokens array split into 2-D "sequences" crashed ``ask``
        # (the corruption campaign, docs/reliability.md).
        for name in ("counts", "anchor_owner", "anchor_per", "anchor_count", "anchor_scale", "dir_scale", "tokens",
                     "tok_len", "radius"):
            if name in arrays and np.ndim(arrays[name]) != 1:
                raise ValueError(f"{name} array has shape {np.shape(arrays[name])}, expected one dimension")
        counts = np.asarray(arrays["counts"])
        if counts.ndim != 1 or counts.dtype.kind not in "iu":
            raise ValueError("counts is not a vector of integers")
        J = len(counts)
        if config.payload == "tokens":
            D = np.zeros((0, H), np.float32)
        else:
            enc = {"data": arrays["dirs"]}
            codecs.check_stored("dirs", enc["data"], config.dir_precision)
            if "dir_scale" in arrays:
                enc["scale"] = arrays["dir_scale"]
            D = codecs.decode(enc, config.dir_precision, H)
        raw = np.asarray(arrays["anchors"])
        scale = np.asarray(arrays["anchor_scale"]) if "anchor_scale" in arrays else None
        full = H * key_parts
        if raw.ndim != 2:
            raise ValueError(f"anchors array has shape {raw.shape}, expected (n, width)")
        codecs.check_stored("anchors", raw, config.key_precision)
        if config.key_precision == "bit":  # full width, or narrowed by repair to a multiple of 8 bits
            cols = raw.shape[1]
            key_dim = full if cols == codecs.bytes_per_vector("bit", full) else 8 * cols
            if key_dim > full or key_dim < 8:
                raise ValueError(f"anchors array has shape {raw.shape}, expected (n, <= "
                                 f"{codecs.bytes_per_vector('bit', full)})")
        else:
            key_dim = raw.shape[1]
            if key_dim != full:
                raise ValueError(f"anchors array has shape {raw.shape}, expected (n, {full})")
        if scale is not None and scale.shape != (len(raw),):
            raise ValueError("anchor_scale does not match the anchors")
        if "anchor_per" in arrays:  # format 2: anchors grouped by prototype, counted per prototype
            per = np.asarray(arrays["anchor_per"]).astype(np.int64)
            if per.shape != (J,) or (J and per.min() < 0) or int(per.sum()) != len(raw):
                raise ValueError("anchor_per does not match the anchors and prototypes")
            owner = np.repeat(np.arange(J, dtype=np.int64), per)
        else:
            owner = np.asarray(arrays["anchor_owner"]).astype(np.int64)
        acount = np.asarray(arrays["anchor_count"]).astype(np.int64)
        if len(acount) != len(owner) or (len(acount) and acount.min() < 1):
            raise ValueError("anchor_count does not match the anchors")
        if len(owner) != len(raw) or (len(owner) and (owner.min() < 0 or owner.max() >= J)):
            raise ValueError("anchor_owner does not index the prototypes")
        if config.payload != "mean":
            if "tok3" in arrays:
                t3 = np.asarray(arrays["tok3"])
                lens = np.asarray(arrays["tok_len"]).astype(np.int64)
                if t3.ndim != 2 or t3.shape[1] != 3 or lens.shape != (J,) or (J and lens.min() < 0) \
                        or int(lens.sum()) != len(t3):
                    raise ValueError("tok3/tok_len do not hold one answer per prototype")
                t = t3.astype(np.int32)
                flat = t[:, 0] | (t[:, 1] << 8) | (t[:, 2] << 16)
                ends = np.cumsum(lens)
                starts = ends - lens
            else:  # format 1: int32 with a separator after each answer
                flat = np.asarray(arrays["tokens"], np.int32)
                if len(flat) and flat.min() < TOKEN_END:
                    raise ValueError(f"tokens array holds a negative token id ({int(flat.min())})")
                ends = np.flatnonzero(flat == TOKEN_END)
                if len(ends) != J:
                    raise ValueError("tokens array does not hold one sequence per prototype")
                starts = np.concatenate([[0], ends[:-1] + 1]) if J else np.zeros(0, np.int64)
        else:
            flat, starts, ends = np.zeros(0, np.int32), np.zeros(J, np.int64), np.zeros(J, np.int64)
        n_dirs = {"mean": J, "sequence": int((ends - starts).sum()), "tokens": 0}[config.payload]
        if n_dirs > len(D):
            raise ValueError("dirs array is shorter than the prototypes need")
        if n_dirs != len(D):
            raise ValueError("dirs array is longer than the prototypes need")
        radius = None
        if config.relevance:
            if "radius" not in arrays:
                raise ValueError("radius array is missing (the relevance gate needs it)")
            radius = np.asarray(arrays["radius"])
            if radius.shape != (J,) or radius.dtype != np.int8 or (J and radius.min() < -RADIUS_SCALE):
                raise ValueError("radius does not hold one int8 radius per prototype")
        self.J, self.counts, self.D, self.raw, self.scale = J, counts, D, raw, scale
        self.key_dim, self.radius = key_dim, radius
        self.owner, self.acount, self._seqs = owner, acount, _Seqs(flat, starts, ends)
        # Each prototype's anchors in stored order: a sort by owner instead of one mask per
        # prototype (O(A log A), not O(J·A)); none when the owners are sorted (as written).
        self.sorted = bool(len(owner) < 2 or (owner[1:] >= owner[:-1]).all())
        self.by_owner = None if self.sorted else np.argsort(owner, kind="stable")

    def radii(self) -> np.ndarray:
        """Each prototype's radius as a cosine (J,); 1.0 everywhere without the relevance gate."""
        return np.ones(self.J) if self.radius is None else self.radius.astype(np.float64) / RADIUS_SCALE

    def owner_sorted(self) -> np.ndarray:
        return self.owner if self.sorted else self.owner[self.by_owner]

    def packed_sorted(self) -> np.ndarray:
        return self.raw if self.sorted else self.raw[self.by_owner]

    def anchors(self) -> np.ndarray:
        enc = {"data": self.packed_sorted()}
        if self.scale is not None:
            enc["scale"] = self.scale if self.sorted else self.scale[self.by_owner]
        return codecs.decode(enc, self.config.key_precision, self.key_dim)

    def seqs(self) -> _Seqs:
        return self._seqs

    def dir_rows(self) -> np.ndarray:
        """First row of each prototype's payload in D (J,), and its length (J,)."""
        L = {"mean": np.ones(self.J, np.int64), "tokens": np.zeros(self.J, np.int64),
             "sequence": (self._seqs.ends - self._seqs.starts).astype(np.int64)}[self.config.payload]
        return np.cumsum(L) - L, L

    def directions(self, position: int) -> np.ndarray:
        D = np.zeros((self.J, self.H), np.float32)
        first, L = self.dir_rows()
        has = np.flatnonzero(position < L)
        D[has] = self.D[first[has] + position]
        return D

    def prototypes(self) -> list[Prototype]:
        """The Prototype objects (what ``from_arrays`` built at open before issue 15)."""
        cfg, H, raw, scale, acount = self.config, self.H, self.raw, self.scale, self.acount
        by_owner = np.arange(len(self.owner)) if self.by_owner is None else self.by_owner
        bounds = np.searchsorted(self.owner[by_owner], np.arange(self.J + 1))

        def anchors_of(j: int) -> tuple[np.ndarray, np.ndarray]:
            idx = by_owner[bounds[j]:bounds[j + 1]]
            enc = {"data": raw[idx]}
            if scale is not None:
                enc["scale"] = scale[idx]
            return codecs.decode(enc, cfg.key_precision, self.key_dim), acount[idx]

        first, L = self.dir_rows()
        radii = self.radii()
        out = []
        for j in range(self.J):
            a, a_n = anchors_of(j)
            seq = self._seqs[j] if cfg.payload != "mean" else np.zeros(0, np.int32)
            f = int(first[j])
            out.append(Prototype(self.D[f:f + int(L[j])].copy(), seq.copy(), a, int(self.counts[j]), a_n,
                                 radius=float(radii[j])))
        return out
