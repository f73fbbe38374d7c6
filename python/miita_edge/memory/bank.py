"""The direction memory: prototypes, their anchors, and budget repair (eqs. 3–5).

A prototype ``u_j = (d_j, A_j, n_j)`` holds a correction payload, a set of
semantic anchors (keys) and the number of experiences merged into it. The
payload has one of three forms (``BankConfig.payload``):

- ``mean``     — one unit direction per prototype, the paper's d_j (eq. 2);
- ``sequence`` — one unit direction per answer position s, d_{j,s} =
                 Norm(W_LMᵀ(e_{y_s} − p_s)), plus the answer tokens y_{j,·};
- ``tokens``   — the answer tokens only; at ask time the direction of y_s is
                 derived from the model's LM head (its unit row, or since the
                 default's version 5 its head-geometry direction), so it costs
                 no memory bytes.

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

from collections import Counter

import numpy as np

from ..errors import BudgetError
from . import codecs
from .bank_arrays import (ANCHOR_COUNT_MAX, StoredArrays, counts_say_anchor_counts, dictionary_pays, distinct_tokens,
                          packed_token_widths, rows_are_smaller, to_arrays, token_row_bytes, tokens_packed)
from .bank_view import QueryView
from .kept_coordinates import decode_kept, order_with_kept
from .narrowing import answer_shares, keep_by_worth
from .prototype import (ANCHOR_FOLDS, MIN_KEY_BITS, SHARED_SPAN, PAYLOADS, RADIUS_SCALE, TOKEN_END, BankConfig, Prototype,
                        RepairLog, WriteResult, cos, joined_evidence, quantize_radius, uint_for, unit_rows)
from .token_ids import token_ids_nbytes

# Re-exported: the bank's settings and unit were defined here before they had a module of their own.
__all__ = ["ANCHOR_FOLDS", "MIN_KEY_BITS", "PAYLOADS", "RADIUS_SCALE", "TOKEN_END", "BankConfig", "MemoryBank",
           "Prototype", "RepairLog", "WriteResult", "quantize_radius"]


class MemoryBank(QueryView):
    """Prototypes in RAM; ``to_arrays``/``from_arrays`` convert to the stored form.

    Mutating methods say so. Vectors are kept as their stored (decoded) values.
    """

    def __init__(self, config: BankConfig, n_embd: int, key_mean: np.ndarray | None = None,
                 key_parts: int = 1, key_order: np.ndarray | None = None, key_dim: int | None = None,
                 key_whiten: np.ndarray | None = None, key_narrow: np.ndarray | None = None,
                 key_scale: np.ndarray | None = None):
        config.validate()
        self.config = config
        self.n_embd = int(n_embd)
        self._protos: list[Prototype] | None = []
        self._stored: StoredArrays | None = None  # a bank opened from the store, before its Prototypes exist
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
        # A (width, full) matrix each centred, block-normalised key is multiplied by before its
        # coordinates are ordered and cut (method/key_whitening.py, method/key_axes.py; derived, not
        # stored). Square, or taller for an overcomplete frame, whose rows are then the key's
        # coordinates (no order after it). None: none.
        self.key_whiten = None if key_whiten is None else np.ascontiguousarray(key_whiten, np.float32)
        if self.key_whiten is not None and (self.key_whiten.ndim != 2 or self.key_whiten.shape[1] != full
                                            or self.key_whiten.shape[0] < full):
            raise ValueError(f"key_whiten has shape {self.key_whiten.shape}, expected (>= {full}, {full})")
        if self.key_whiten is not None and self.key_whiten.shape[0] > full and self.key_order is not None:
            raise ValueError("an overcomplete key frame takes no coordinate order after it")
        # The frame a key moves to the first time repair narrows it (a (width >= full, full) matrix
        # applied like ``key_whiten`` to a centred, block-normalised key, no order after it; derived,
        # not stored): a key keeps the frame above while it holds every coordinate, and this one, cut
        # to ``key_dim``, once it holds fewer (``narrow_keys``). None: the frame above throughout.
        self.key_narrow = None if key_narrow is None else np.ascontiguousarray(key_narrow, np.float32)
        if self.key_narrow is not None:
            if self.key_narrow.ndim != 2 or self.key_narrow.shape[1] != full or self.key_narrow.shape[0] < full:
                raise ValueError(f"key_narrow has shape {self.key_narrow.shape}, expected (>= {full}, {full})")
            if self.key_whiten is not None and self.key_whiten.shape[0] != full:
                raise ValueError("a frame for narrowed keys needs a square frame before it")
        width = full if self.key_whiten is None else self.key_whiten.shape[0]
        # Coordinates a stored key keeps now (repair may narrow 1-bit keys, never widen them).
        self.key_dim = width if key_dim is None else int(key_dim)
        if not 0 < self.key_dim <= width:
            raise ValueError(f"key width {self.key_dim} outside 1..{width}")
        # Where a balanced narrowing (``narrow_rule``) kept other coordinates than the frame's first
        # key_dim: their places in the derived order, ascending (stored, ``key_kept``), and that
        # order; ``key_order`` is then the kept places first. None: the first key_dim (a prefix).
        self.key_kept: np.ndarray | None = None
        self._base_order = self.key_order
        # With narrow_rule "balanced-shared": the sign every key has at each dropped place among the
        # first SHARED_SPAN (stored once, ``key_shared``); these are a key's last coordinates, after
        # the ``key_stored`` it stores itself. Empty: none.
        self.key_shared = np.zeros(0, np.float32)
        # Each coordinate's typical size in a query (method/calibration.coordinate_rms; derived, not
        # stored), indexed as the coordinates before the order: a balanced narrowing weighs by it.
        # None: every coordinate alike.
        self.key_scale = None if key_scale is None else np.asarray(key_scale, np.float64)
        if self.key_scale is not None and self.key_scale.shape != (width,):
            raise ValueError(f"key_scale has shape {self.key_scale.shape}, expected ({width},)")

    @property
    def protos(self) -> list[Prototype]:
        """The prototypes, in order. A bank opened by ``from_arrays`` makes these Python objects on
        first use, not at open: a large memory's objects take seconds to make, while answering
        needs only the views (``bank_view``), which read the stored arrays directly."""
        if self._protos is None:
            self._protos = self._stored.prototypes()
            self._stored = None
        return self._protos

    @protos.setter
    def protos(self, value: list[Prototype]) -> None:
        self._protos, self._stored = list(value), None

    # ------------------------------------------------------------ views

    def similarity(self, a: Prototype, b: Prototype) -> float:
        pay = self.config.payload
        if pay == "mean":
            return cos(a.dirs[0], b.dirs[0])
        L = max(len(a.tokens), len(b.tokens))
        if L == 0:
            return 0.0
        m = min(len(a.tokens), len(b.tokens))
        if pay == "tokens":
            return float(np.sum(a.tokens[:m] == b.tokens[:m])) / L
        return float(sum(cos(a.dirs[s], b.dirs[s]) for s in range(m))) / L

    def _mergeable(self, a: Prototype, b: Prototype) -> bool:
        if self.config.payload == "mean":
            return True
        return len(a.tokens) == len(b.tokens) and bool(np.all(a.tokens == b.tokens))

    # ------------------------------------------------------------ write (eqs. 3, 4)
    def write(self, dirs: np.ndarray, tokens: np.ndarray, key: np.ndarray,
              evidence: np.ndarray | None = None) -> WriteResult:
        """Mutates: add one experience. ``dirs`` unnormalised rows (mean: 1 row;
        sequence: one per token; tokens: ignored); ``key`` the raw pooled key; ``evidence`` the input's tokens."""
        pay = self.config.payload
        tokens = np.asarray(tokens, np.int32).reshape(-1)
        if pay == "mean":
            d = codecs.roundtrip(unit_rows(np.asarray(dirs).reshape(1, -1)), self.config.dir_precision)
            tokens = np.zeros(0, np.int32)
        elif pay == "sequence":
            d = codecs.roundtrip(unit_rows(dirs), self.config.dir_precision)
            if len(d) != len(tokens):
                raise ValueError("sequence payload needs one direction per answer token")
        else:
            d = np.zeros((0, self.n_embd), np.float32)
        kp = self.prepare_key(key)[None].astype(np.float32)
        own = self.store_key(kp[0])  # the example as a query would be compared
        if len(self.key_shared):  # every key has the shared signs there (sums keep them through folds)
            kp[0, self.key_stored:] = self.key_shared * np.abs(kp[0, self.key_stored:])
        k = self.store_key(kp[0])
        ev = np.asarray(evidence if self.config.evidence and evidence is not None else [], np.int32).reshape(-1)
        new = Prototype(d, tokens, k, 1, np.ones(1, np.int64), kp.copy(), evidence=ev if len(ev) else None)
        if self.protos:
            sims = [self.similarity(new, p) if self._mergeable(new, p) else -np.inf for p in self.protos]
            j = int(np.argmax(sims))
            if sims[j] >= self.config.tau_d:
                p = self.protos[j]
                if pay != "tokens":  # eq. 3, position-wise for sequences
                    merged = unit_rows(p.n * p.dirs + new.dirs[0 if pay == "mean" else slice(None)])
                    p.dirs = codecs.roundtrip(merged, self.config.dir_precision)
                p.n += 1
                p.evidence = joined_evidence(p.evidence, ev, self.config.evidence_inputs)
                # stored anchors are unit-norm except 'bit' (±1): normalise both sides
                # with its own signs at the shared coordinates, as a query is: the radius says how near
                # the answer's examples come as questions, and novelty is judged the same way
                novel = self._max_anchorcos(p.anchors, own[0])
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
    def _max_anchorcos(anchors: np.ndarray, k: np.ndarray) -> float:
        if len(anchors) == 0:
            return -1.0
        num = anchors @ k
        den = np.linalg.norm(anchors, axis=1) * max(float(np.linalg.norm(k)), 1e-12)
        return float(np.max(num / np.maximum(den, 1e-12)))

    # ------------------------------------------------------------ sizes and value (eq. 5)
    def proto_bytes(self, p: Prototype, token_users: Counter | None = None, itemsizes: dict | None = None) -> float:
        """Bytes this prototype adds to the stored arrays (its share of Size(B)), as ``to_arrays``
        lays them out now: payload, anchors with their counts, and one entry in each per-prototype
        array (anchors owned, count, answer length), each count the narrowest unsigned type of the
        bank's current largest value (no anchors-owned entry while every prototype owns one anchor);
        one dictionary index per answer token and the dictionary rows (2 bytes, 3 from id 2^16; as a
        Rice-coded list, its mean bytes per id: an estimate, since an id's gaps depend on its neighbours) of
        the ids no other prototype's answer uses, or 3 bytes per token where the bank's answers are
        stored without a dictionary (``dictionary_pays``); where the lengths and indices are one bit
        stream (``tokens_packed``), its length's and indices' bits, in bytes (a fraction) (``token_users``: how many prototypes use
        each id, counted here when not given; ``itemsizes``: the bank-wide widths, likewise); the radius byte."""
        cfg, H = self.config, self.n_embd
        isz = self._per_proto_itemsizes() if itemsizes is None else itemsizes
        b = len(p.dirs) * codecs.bytes_per_vector(cfg.dir_precision, H)
        b += len(p.anchors) * (codecs.bytes_per_vector(cfg.key_precision, self.key_stored) + isz["acnt"])
        b += isz["per"] + isz["cnt"]
        if cfg.payload != "mean":
            if isz["dict"]:
                users = self._token_users() if token_users is None else token_users
                only = [t for t in set(p.tokens.tolist()) if users[t] == 1]
                # a Rice-coded dictionary (tok_ids): the mean bytes of one of its ids
                b += len(only) * isz["row"] if isz["row"] else sum(token_row_bytes(t) for t in only)
                if isz["pack"]:  # its length and indices in the bit stream (tok_bits)
                    L, B = isz["pack"]
                    b += (L + len(p.tokens) * B) / 8
                else:
                    b += len(p.tokens) * isz["idx"] + isz["len"]
            else:
                b += 3 * len(p.tokens) + isz["len"]
        if p.evidence is not None:  # its input's tokens, 3 bytes each, and their count
            b += 3 * len(p.evidence) + 1
        return b + (1 if cfg.relevance else 0)

    def _token_users(self) -> Counter:
        return Counter(t for q in self.protos for t in set(np.asarray(q.tokens).tolist()))

    def _per_proto_itemsizes(self) -> dict[str, int]:
        protos = self.protos
        ids = distinct_tokens(protos) if self.config.payload != "mean" else np.zeros(0, np.int64)
        per = [len(q.anchors) for q in protos]
        lens = [len(q.tokens) for q in protos]
        use_dict = self.config.payload != "mean" and dictionary_pays(ids, sum(lens), lens)
        return {"idx": np.dtype(uint_for(max(len(ids) - 1, 0))).itemsize,
                "dict": use_dict,
                "row": token_ids_nbytes(ids) / len(ids) if use_dict and not rows_are_smaller(ids) else None,
                # the lengths and indices as one bit stream where it is smaller (bank_arrays.tokens_packed)
                "pack": packed_token_widths(len(ids), lens) if use_dict and tokens_packed(len(ids), lens) else None,
                # no anchor_per array while every prototype owns one anchor
                "per": np.dtype(uint_for(max(per))).itemsize if any(n != 1 for n in per) else 0,
                "cnt": np.dtype(uint_for(max((q.n for q in protos), default=0))).itemsize,
                "len": np.dtype(uint_for(max((len(q.tokens) for q in protos), default=0))).itemsize,
                # no anchor_count array where counts says it (bank_arrays.counts_say_anchor_counts)
                "acnt": 0 if counts_say_anchor_counts(protos) else
                np.dtype(uint_for(min(max((int(c) for q in protos for c in q.anchor_n), default=0),
                                      ANCHOR_COUNT_MAX))).itemsize}

    def values(self) -> np.ndarray:
        """value(u_j) = log(1+n_j)·(1 − max_{r≠j} sim(d_j, d_r)) / Size(u_j)   (eq. 5)."""
        J = len(self.protos)
        out = np.zeros(J)
        users, isz = self._token_users(), self._per_proto_itemsizes()  # bank-wide: once, not per prototype
        for j, p in enumerate(self.protos):
            mx = max((self.similarity(p, q) for r, q in enumerate(self.protos) if r != j), default=0.0)
            out[j] = np.log1p(p.n) * (1.0 - mx) / self.proto_bytes(p, users, isz)
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
        (Banking77 at 20%: BWT -13.6 with the closest pair, -4.7 with Ward; docs/method.md, "Repair under a
        byte budget").
        Ward's cost is small for a pair with a lone example, so outliers join a centroid first.
        The one standing for fewer keys folds into the other (ties: the later index); ties in
        cost go to the first prototype, then the first pair in row order."""
        best = (np.inf, -1, -1, -1)
        for j, p in enumerate(self.protos):
            if len(p.anchors) < 2:
                continue
            U = unit_rows(p.anchors).astype(np.float64)
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
            U = unit_rows(p.anchors)
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
        G = unit_rows(p.anchors) @ unit_rows(p.anchors[victim:victim + 1])[0]
        G[victim] = -np.inf
        self._fold_into(p, victim, int(np.argmax(G)))

    def _fold_into(self, p: Prototype, victim: int, survivor: int) -> None:
        """Mutates ``p``: anchor ``survivor`` stands for its keys and ``victim``'s, which goes."""
        p.anchor_sum[survivor] = p.anchor_sum[survivor] + p.anchor_sum[victim]
        p.anchor_n[survivor] += p.anchor_n[victim]
        p.anchors[survivor] = self.store_key(unit_rows(p.anchor_sum[survivor]))[0]
        keep = np.arange(len(p.anchors)) != victim
        p.anchors, p.anchor_n, p.anchor_sum = p.anchors[keep], p.anchor_n[keep], p.anchor_sum[keep]

    def narrow_keys(self) -> bool:
        """Mutates: drop the last 8 coordinates of every stored key (1-bit keys only, with
        ``shrink_keys``); False at ``BankConfig.min_key_bits`` or when not allowed.

        Why before merging and evicting: at a tight budget a narrower key keeps every answer
        retrievable, where an eviction loses one for good. The coordinates are in ``key_order``
        (the calibration keys' spread, highest first), so what goes is what varies least; with
        one centroid per label on Banking77, 640 -> 160 -> 80 bits of layer 12 kept 66 / 61 / 52%
        of the vote where index order kept 66 / 51 / 27% (docs/method.md). Sign bits need no
        original to narrow from, so this is exact: a narrowed key is the stored key's prefix."""
        cfg = self.config
        m = (self.key_stored - 1) // 8 * 8  # the next narrower multiple of 8 bits (whole stored bytes)
        if not cfg.shrink_keys or cfg.key_precision != "bit" or m < cfg.min_key_bits:
            return False
        if self.key_narrow is not None and not self.narrowed:
            self._move_to_narrow_frame(m)
            return True
        balanced = cfg.narrow_rule != "prefix" and self._orderable
        keep = self._balanced_keep(m) if balanced else np.arange(m)
        stored = self.key_stored
        places = np.arange(stored) if self.key_kept is None else self.key_kept
        dropped = np.setdiff1d(np.arange(stored), keep)
        # dropped places that join the shared bits (balanced-shared), with the answers' majority sign
        joins = dropped[places[dropped] < SHARED_SPAN] if cfg.narrow_rule.endswith("-shared") and balanced \
            else np.zeros(0, np.int64)
        signs = np.where(answer_shares(self.protos, joins) >= 0.5, 1.0, -1.0).astype(np.float32)
        shared_places = np.concatenate([self._shared_places(), places[joins]])
        shared_signs = np.concatenate([self.key_shared, signs])
        by_place = np.argsort(shared_places, kind="stable")
        cols = np.concatenate([stored + np.arange(len(self.key_shared)), joins])  # as shared_places
        cols = np.concatenate([keep, cols[by_place]])
        for p in self.protos:
            s, a = p.anchor_sum[:, cols], p.anchors[:, cols]
            if len(joins):  # the new shared coordinates take the shared sign in every anchor and sum
                a[:, m:] = shared_signs[by_place]
                s[:, m:] = shared_signs[by_place] * np.abs(s[:, m:])
            p.anchor_sum, p._anchors = s, a
        if not np.array_equal(keep, np.arange(m)) or self.key_kept is not None or len(joins):
            self._keep_places(places[keep], shared_places[by_place])
        self.key_shared = shared_signs[by_place]
        self.key_dim = m + len(self.key_shared)
        return True

    @property
    def key_stored(self) -> int:
        """Coordinates each key stores itself: ``key_dim`` less the shared ones."""
        return self.key_dim - len(self.key_shared)

    def _shared_places(self) -> np.ndarray:
        """The places (in the derived order) of the shared coordinates: those among the first
        SHARED_SPAN that a key does not store itself, ascending (so not stored)."""
        if not len(self.key_shared):
            return np.zeros(0, np.int64)
        kept = np.arange(self.key_stored) if self.key_kept is None else self.key_kept
        return np.setdiff1d(np.arange(SHARED_SPAN), kept)

    @property
    def _orderable(self) -> bool:
        """Whether the key frame has a coordinate order to keep places of: not an overcomplete frame
        (its rows are the coordinates, no order after it) nor one keys move to when narrowed."""
        return self.key_narrow is None and (self.key_whiten is None
                                            or self.key_whiten.shape[0] == self.n_embd * self.key_parts)

    def _balanced_keep(self, m: int) -> np.ndarray:
        """The ``m`` of the stored coordinates a balanced narrowing keeps (``narrowing.keep_by_worth``),
        each weighed by its size in a query where the bank has one (``key_scale``)."""
        K = self.key_stored
        coords = self.key_order[:K] if self.key_order is not None else np.arange(K)
        scale = None if self.key_scale is None else self.key_scale[coords]
        return keep_by_worth(self.protos, K, m, self.config.narrow_rule, scale)

    def _keep_places(self, places: np.ndarray, shared: np.ndarray) -> None:
        """Mutates: keys store the coordinates at ``places`` (ascending places in the derived order,
        ``key_kept``) and share those at ``shared``; ``key_order`` lists the stored ones first, then
        the shared ones, then the rest in that order."""
        width = self.n_embd * self.key_parts if self.key_whiten is None else self.key_whiten.shape[0]
        base = np.arange(width) if self._base_order is None else self._base_order
        self.key_kept = None if np.array_equal(places, np.arange(len(places))) and not len(shared) else places
        self.key_order = order_with_kept(base, places, shared)

    def _move_to_narrow_frame(self, m: int) -> None:
        """Mutates: every anchor goes from the full-width frame to the first ``m`` rows of
        ``key_narrow``. A frame is linear, so an anchor's sum of prepared keys maps through
        ``key_narrow @ F^-1`` (F the full-width frame: the whitening, its rows in ``key_order``),
        each key weighted by 1/|F k| instead of 1/|key_narrow[:m] k|: the signs of a one-key anchor
        are exactly those its key would get in the new frame. A bank opened from the store has no
        sums, only its stored bits (``Prototype.anchor_sum``'s estimate), so there the move works
        from the sign bits of the coordinates, as merging does."""
        full = self.n_embd * self.key_parts
        F = np.eye(full, dtype=np.float64) if self.key_whiten is None else self.key_whiten.astype(np.float64)
        if self.key_order is not None:
            F = F[self.key_order]
        T = np.linalg.solve(F.T, self.key_narrow[:m].astype(np.float64).T).T  # (m, full): T @ F = key_narrow[:m]
        for p in self.protos:
            s = (p.anchor_sum.astype(np.float64) @ T.T).astype(np.float32)
            p.anchor_sum = s
            p._anchors = codecs.roundtrip(unit_rows(s), self.config.key_precision) if len(s) else s
        self.key_dim = m

    @property
    def narrowed(self) -> bool:
        """Whether keys are in ``key_narrow``'s frame: it has one, and keys hold fewer than every
        coordinate (narrowing from full width is what moves them there)."""
        return self.key_narrow is not None and self.key_dim < self.n_embd * self.key_parts

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
            pa.dirs = codecs.roundtrip(unit_rows(pa.n * pa.dirs + pb.n * pb.dirs), self.config.dir_precision)
        pa.n += pb.n
        pa.evidence = None  # two examples now: the radius test judges it
        pa.radius = min(pa.radius, pb.radius)
        pa.anchors = np.concatenate([pa.anchors, pb.anchors])
        pa.anchor_n = np.concatenate([pa.anchor_n, pb.anchor_n])
        pa.anchor_sum = np.concatenate([pa.anchor_sum, pb.anchor_sum])
        del self.protos[b]
        return True

    def drop_evidence(self) -> bool:
        """Mutates: let go of one prototype's evidence, the longest (ties: the oldest); False if none holds
        any. Repair's first step: evidence never costs a key bit, an anchor or an answer (method/verify)."""
        held = [(len(p.evidence), -j) for j, p in enumerate(self.protos) if p.evidence is not None]
        if not held:
            return False
        self.protos[-max(held)[1]].evidence = None
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
            if self.drop_evidence():
                log.dropped += 1
            elif self.prune_one_anchor():
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
        """The arrays that persist this bank (``bank_arrays.to_arrays``); with ``shapes_only``
        zero-cost views of the right shape and dtype, for exact sizing."""
        return to_arrays(self, shapes_only)

    @classmethod
    def from_arrays(cls, config: BankConfig, n_embd: int, arrays: dict[str, np.ndarray],
                    key_mean: np.ndarray | None = None, key_parts: int = 1,
                    key_order: np.ndarray | None = None, key_whiten: np.ndarray | None = None,
                    key_narrow: np.ndarray | None = None, key_scale: np.ndarray | None = None) -> "MemoryBank":
        """Rebuild from stored arrays; raises ValueError on inconsistent arrays.

        ``key_mean``, ``key_order``, ``key_whiten``, ``key_narrow`` and ``key_scale`` are not stored: they derive from the model and template
        (see ``Miita``), so the caller passes them in again; the key width is the stored one.
        Every array is checked here; the Prototype objects are made on first use of ``protos``.
        """
        width = None if key_whiten is None else int(np.shape(key_whiten)[0])
        stored = StoredArrays(config, int(n_embd), int(key_parts), arrays, width)
        full = int(n_embd) * int(key_parts) if width is None else width
        kept, shared_places, shared = None, np.zeros(0, np.int64), np.zeros(0, np.float32)
        if "key_kept" in arrays:
            if key_narrow is not None or full != int(n_embd) * int(key_parts):
                raise ValueError("key_kept is stored, but this memory's key frame has no coordinate order to keep "
                                 "places of")
            kept = decode_kept(arrays["key_kept"], stored.key_dim, full)
            if "key_shared" in arrays:
                shared_places = np.setdiff1d(np.arange(min(SHARED_SPAN, full)), kept)
                shared = stored.share(shared_places)
        elif "key_shared" in arrays:
            raise ValueError("key_shared is stored without key_kept")
        base = None if key_order is None else np.asarray(key_order, np.int64)
        order = base if kept is None else order_with_kept(np.arange(full) if base is None else base, kept,
                                                          shared_places)
        bank = cls(config, n_embd, key_mean, key_parts, order, stored.key_dim, key_whiten, key_narrow, key_scale)
        bank.key_kept, bank._base_order, bank.key_shared = kept, base, shared
        bank._stored = stored
        bank._protos = None
        return bank
