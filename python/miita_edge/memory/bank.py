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
  becomes the survivor, so pruned anchors condense into centroids); (2) merge the
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

PAYLOADS = ("mean", "sequence", "tokens")
TOKEN_END = -1  # separator after each prototype's answer tokens in the flat 'tokens' array


@dataclass
class BankConfig:
    payload: str = "mean"
    dir_precision: str = "float32"
    key_precision: str = "float32"
    tau_d: float = 0.85
    tau_k: float = 0.80
    tau_merge: float = 0.5

    def validate(self) -> None:
        if self.payload not in PAYLOADS:
            raise ValueError(f"payload must be one of {PAYLOADS}")
        if self.dir_precision not in codecs.DIR_PRECISIONS:
            raise ValueError(f"dir_precision must be one of {codecs.DIR_PRECISIONS}")
        if self.key_precision not in codecs.KEY_PRECISIONS:
            raise ValueError(f"key_precision must be one of {codecs.KEY_PRECISIONS}")
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
                 anchor_n: np.ndarray | None = None, anchor_sum: np.ndarray | None = None) -> None:
        self.dirs = dirs
        self.tokens = tokens
        self._anchors = anchors
        self.n = n
        self._anchor_n = np.ones(len(anchors), np.int64) if anchor_n is None else anchor_n
        self._anchor_sum = anchor_sum

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

    def __iadd__(self, other: "RepairLog") -> "RepairLog":
        self.pruned += other.pruned
        self.merged += other.merged
        self.evicted += other.evicted
        return self


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

    def __init__(self, config: BankConfig, n_embd: int, key_mean: np.ndarray | None = None):
        config.validate()
        self.config = config
        self.n_embd = int(n_embd)
        self.protos: list[Prototype] = []
        # Centring vector for keys (stored as float16); None: keys are not centred.
        self.key_mean = None if key_mean is None else np.asarray(key_mean, np.float16).astype(np.float32)

    # ------------------------------------------------------------ views
    @property
    def n_prototypes(self) -> int:
        return len(self.protos)

    @property
    def n_anchors(self) -> int:
        return sum(len(p.anchors) for p in self.protos)

    def anchor_matrix(self) -> tuple[np.ndarray, np.ndarray]:
        """All anchors (A, H) float32 and their owner prototype index (A,)."""
        if not self.protos:
            return np.zeros((0, self.n_embd), np.float32), np.zeros(0, np.int64)
        A = np.concatenate([p.anchors for p in self.protos])
        owner = np.concatenate([np.full(len(p.anchors), j) for j, p in enumerate(self.protos)])
        return A, owner

    def directions(self, position: int = 0) -> np.ndarray:
        """(J, H) direction of each prototype at an answer position (zeros where absent)."""
        D = np.zeros((len(self.protos), self.n_embd), np.float32)
        for j, p in enumerate(self.protos):
            if position < len(p.dirs):
                D[j] = p.dirs[position]
        return D

    def prepare_key(self, key: np.ndarray) -> np.ndarray:
        """Raw mean-pooled key -> the vector that is compared and stored (centred, unit)."""
        k = np.asarray(key, np.float32)
        if self.key_mean is not None:
            k = k - self.key_mean
        n = np.linalg.norm(k)
        return k / n if n > 0 else k

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
        """Bytes this prototype adds to the stored arrays (its share of Size(B))."""
        H = self.n_embd
        b = len(p.dirs) * codecs.bytes_per_vector(self.config.dir_precision, H)
        b += len(p.anchors) * (codecs.bytes_per_vector(self.config.key_precision, H) + self._owner_itemsize() + 2)
        if self.config.payload != "mean":
            b += 4 * (len(p.tokens) + 1)
        return b + 4  # count

    def _owner_itemsize(self) -> int:
        return 2 if len(self.protos) < 65536 else 4

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
        """Mutates: fold the most redundant anchor into its nearest sibling (see module doc).

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
        p = self.protos[best[1]]
        victim = best[2]
        G = _unit_rows(p.anchors) @ _unit_rows(p.anchors[victim:victim + 1])[0]
        G[victim] = -np.inf
        survivor = int(np.argmax(G))
        p.anchor_sum[survivor] = p.anchor_sum[survivor] + p.anchor_sum[victim]
        p.anchor_n[survivor] += p.anchor_n[victim]
        p.anchors[survivor] = self.store_key(_unit_rows(p.anchor_sum[survivor]))[0]
        keep = np.arange(len(p.anchors)) != victim
        p.anchors, p.anchor_n, p.anchor_sum = p.anchors[keep], p.anchor_n[keep], p.anchor_sum[keep]
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
        zero-cost broadcast views of the right shape/dtype (for exact sizing)."""
        cfg, H, J = self.config, self.n_embd, len(self.protos)
        key_bytes_cols = (H + 7) // 8 if cfg.key_precision == "bit" else H
        owner_dtype = np.uint16 if J < 65536 else np.uint32
        A = self.n_anchors
        out: dict[str, np.ndarray] = {}

        def fake(shape, dtype):
            return np.broadcast_to(np.zeros((), dtype), shape)

        kdt = {"float32": np.float32, "float16": np.float16, "int8": np.int8, "bit": np.uint8}
        if shapes_only:
            n_dirs = sum(len(p.dirs) for p in self.protos)
            if cfg.payload != "tokens":
                out["dirs"] = fake((n_dirs, H), kdt[cfg.dir_precision])
                if cfg.dir_precision == "int8":
                    out["dir_scale"] = fake((n_dirs,), np.float32)
            out["anchors"] = fake((A, key_bytes_cols), kdt[cfg.key_precision])
            if cfg.key_precision == "int8":
                out["anchor_scale"] = fake((A,), np.float32)
            out["anchor_owner"] = fake((A,), owner_dtype)
            out["anchor_count"] = fake((A,), np.uint16)
            out["counts"] = fake((J,), np.uint32)
            if cfg.payload != "mean":
                out["tokens"] = fake((sum(len(p.tokens) + 1 for p in self.protos),), np.int32)
            return out

        if cfg.payload != "tokens":
            D = np.concatenate([p.dirs for p in self.protos]) if J else np.zeros((0, H), np.float32)
            enc = codecs.encode(D, cfg.dir_precision)
            out["dirs"] = enc["data"]
            if "scale" in enc:
                out["dir_scale"] = enc["scale"]
        Amat, owner = self.anchor_matrix()
        enc = codecs.encode(Amat, cfg.key_precision)
        out["anchors"] = enc["data"].reshape(A, key_bytes_cols)
        if "scale" in enc:
            out["anchor_scale"] = enc["scale"]
        out["anchor_owner"] = owner.astype(owner_dtype)
        an = np.concatenate([p.anchor_n for p in self.protos]) if J else np.zeros(0, np.int64)
        out["anchor_count"] = np.minimum(an, 65535).astype(np.uint16)
        out["counts"] = np.array([p.n for p in self.protos], np.uint32)
        if cfg.payload != "mean":
            parts = [np.append(p.tokens, TOKEN_END).astype(np.int32) for p in self.protos]
            out["tokens"] = np.concatenate(parts) if parts else np.zeros(0, np.int32)
        return out

    @classmethod
    def from_arrays(cls, config: BankConfig, n_embd: int, arrays: dict[str, np.ndarray],
                    key_mean: np.ndarray | None = None) -> "MemoryBank":
        """Rebuild from stored arrays; raises ValueError on inconsistent arrays.

        ``key_mean`` is not stored: it derives from the model and template
        (see ``Miita``), so the caller passes it in again.
        """
        H = n_embd
        bank = cls(config, H, key_mean)
        # A store accepts any valid arrays (a forged file with a recomputed checksum is valid), so the
        # ranks are checked here: a 2-D tokens array split into 2-D "sequences" crashed ``ask``
        # (the corruption campaign, docs/reliability.md).
        for name in ("counts", "anchor_owner", "anchor_count", "anchor_scale", "dir_scale", "tokens"):
            if name in arrays and np.ndim(arrays[name]) != 1:
                raise ValueError(f"{name} array has shape {np.shape(arrays[name])}, expected one dimension")
        counts = np.asarray(arrays["counts"])
        J = len(counts)
        if config.payload == "tokens":
            D = np.zeros((0, H), np.float32)
        else:
            enc = {"data": arrays["dirs"]}
            if "dir_scale" in arrays:
                enc["scale"] = arrays["dir_scale"]
            D = codecs.decode(enc, config.dir_precision, H)
        raw = np.asarray(arrays["anchors"])
        scale = np.asarray(arrays["anchor_scale"]) if "anchor_scale" in arrays else None
        width = codecs.bytes_per_vector(config.key_precision, H) if config.key_precision == "bit" else H
        if raw.ndim != 2 or raw.shape[1] != width:
            raise ValueError(f"anchors array has shape {raw.shape}, expected (n, {width})")
        if scale is not None and scale.shape != (len(raw),):
            raise ValueError("anchor_scale does not match the anchors")
        owner = np.asarray(arrays["anchor_owner"]).astype(np.int64)
        acount = np.asarray(arrays["anchor_count"]).astype(np.int64)
        if len(acount) != len(owner) or (len(acount) and acount.min() < 1):
            raise ValueError("anchor_count does not match the anchors")
        if len(owner) != len(raw) or (len(owner) and (owner.min() < 0 or owner.max() >= J)):
            raise ValueError("anchor_owner does not index the prototypes")
        # Each prototype's anchors in stored order, decoded one prototype at a time: a sort by owner
        # instead of one mask per prototype (O(A log A), not O(J·A)), and no decoded copy of the
        # whole anchor matrix beside the per-prototype ones (peak memory of opening, issue 15).
        by_owner = np.argsort(owner, kind="stable")
        bounds = np.searchsorted(owner[by_owner], np.arange(J + 1))

        def anchors_of(j: int) -> tuple[np.ndarray, np.ndarray]:
            idx = by_owner[bounds[j]:bounds[j + 1]]
            enc = {"data": raw[idx]}
            if scale is not None:
                enc["scale"] = scale[idx]
            return codecs.decode(enc, config.key_precision, H), acount[idx]
        if config.payload != "mean":
            flat = np.asarray(arrays["tokens"], np.int32)
            if len(flat) and flat.min() < TOKEN_END:
                raise ValueError(f"tokens array holds a negative token id ({int(flat.min())})")
            ends = np.flatnonzero(flat == TOKEN_END)
            if len(ends) != J:
                raise ValueError("tokens array does not hold one sequence per prototype")
            seqs = np.split(flat, ends + 1)[:J]
            seqs = [s[:-1] for s in seqs]
        else:
            seqs = [np.zeros(0, np.int32)] * J
        row = 0
        for j in range(J):
            L = 1 if config.payload == "mean" else (len(seqs[j]) if config.payload == "sequence" else 0)
            if row + L > len(D):
                raise ValueError("dirs array is shorter than the prototypes need")
            a, a_n = anchors_of(j)
            bank.protos.append(Prototype(D[row:row + L].copy(), seqs[j].copy(), a, int(counts[j]), a_n))
            row += L
        if row != len(D):
            raise ValueError("dirs array is longer than the prototypes need")
        return bank
