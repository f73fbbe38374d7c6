"""An inverted file over packed 1-bit keys: the recall front of the default preset's vote for
large memories.

Why not a usearch graph (``ann_index.AnnIndex``, the front of the paper preset's float rows):
right after a prompt is decoded the caches are cold, and a graph walk is a chain
of dependent reads through memory the prompt evicted, too slow at the breadth that keeps recall
high. An inverted file reads a few contiguous blocks instead: the centroids, then the probed lists,
each one native call (docs/method.md, "Retired experiments": ``ann_breadth.py``; docs/benchmarks.md). It needs no
optional package.

How it scores: the query is coded as the signs of its coordinates, and the stronger half of them
(|q_i| at or above the median) is a mask: the masked Hamming distance counts disagreements where
the query is sure, the code the graph used too (there each bit stored twice). The centroids and
the probed lists' rows are ranked by it; the candidates are re-scored exactly by the caller, as
the graph's were, so the final selection is the exact scan's whenever the true top rows are among
the candidates.

How it is built (deterministic, seed 0): ``nlist`` centroids by Hamming k-means (bitwise majority)
over a sample of the distinct rows, then every distinct row in its nearest centroid's list, the
lists stored contiguously. Identical rows are indexed once and come back as a group, as with the
graph (one-anchor prototypes have a centroid equal to their anchor). Derived from the stored keys
and never stored in the memory: cached beside the graphs (``ann_index.cache_dir``) and mapped.
"""
from __future__ import annotations

import math
import zlib
from pathlib import Path

import numpy as np

from ..native import ext
from .exact_scores import bit_top
from .index_files import HEADER, DuplicateGroups, duplicate_rows, map_container, write_container

__all__ = ["IvfIndex", "SCAN_ROWS", "list_count", "probe_count"]

#: rows a probe aims to read in its lists: recall >= 0.99 of the exact top 8 at 100,000 and
#: 1,000,000 clustered real-like rows (docs/method.md, "Retired experiments": ``ann_breadth.py``; docs/benchmarks.md)
SCAN_ROWS = 8192
#: candidates a probe proposes, by the rows indexed (the last threshold reached applies), and at
#: least 16 per wanted row: as many as the graph front proposes (ann_index.SEARCH), so the two
#: fronts hand the exact re-score the same number of candidates
CANDIDATES = ((0, 256), (500_000, 512))
#: centroids per distinct row: ~4 sqrt(n), a power of two (1,024 at 100,000 rows, 4,096 at 1,000,000)
LISTS_PER_SQRT = 4
#: sample rows per centroid for the k-means rounds, and the rounds
SAMPLE_PER_LIST = 32
ROUNDS = 3
BUILD_THREADS = 1  # a background build leaves the other core to the prompt decode

_MAGIC = b"MIITAIVF"
_FORMAT = 1


def list_count(n: int) -> int:
    """Centroids for ``n`` distinct rows: the power of two nearest 4·sqrt(n), 16 to 65,536."""
    if n <= 16:
        return max(1, n)
    return int(min(65536, max(16, 2 ** round(math.log2(LISTS_PER_SQRT * math.sqrt(n))))))


def probe_count(n: int, nlist: int) -> int:
    """Lists a probe reads: about ``SCAN_ROWS`` rows, at least 16 lists (or all)."""
    if n <= 0:
        return nlist
    return int(min(nlist, max(16, math.ceil(SCAN_ROWS * nlist / n))))


def query_code(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(packed signs, packed mask of the stronger half of the coordinates) of a float query:
    ``index_files.strong_half`` packed, in one native call (its numpy steps are slow right after a
    prompt is decoded)."""
    return ext.sign_code(np.asarray(q, np.float32).reshape(-1))


class IvfIndex:
    """Centroids ``cent`` (nlist, B), list bounds ``starts`` (nlist + 1,), the distinct rows in list
    order ``lists`` (m, B) with their row ids ``order`` (m,), and the duplicate groups ``dups``
    (rep, start, members) of ``index_files.duplicate_rows``. ``keep`` holds a mapped file's buffer."""

    kind_suffix = ".ivf"

    def __init__(self, cent, starts, order, lists, n_rows: int, kind: str, dups, keep=None) -> None:
        self.cent, self.starts, self.order, self.lists = cent, starts, order, lists
        self.n_rows, self.kind, self.keep = int(n_rows), kind, keep
        self.dups = DuplicateGroups(*dups, n_rows=self.n_rows)
        self.nprobe = 0  # override (benchmarks); 0: probe_count's
        self.list_twins = self.dups.twins(order)  # in list order: read beside the probed lists
        self._search = None  # the native view (ext.IvfSearch), made on the first scored_top
        self._candidates = next(c for start, c in reversed(CANDIDATES) if self.n_rows >= start)
        self._all_cent = (np.zeros(1, np.int64), np.array([len(cent)], np.int64))

    # ------------------------------------------------------------------ search
    def propose(self, q: np.ndarray, k: int) -> np.ndarray:
        """Candidates for a top ``k``: 256 rows below 500,000 rows, 512 from there (at least 16 per
        wanted row), as the graph proposed."""
        return self.candidates(q, self._count(k))

    def candidates(self, q: np.ndarray, count: int, nprobe: int = 0) -> np.ndarray:
        """Row ids near ``q``: the ``count`` distinct rows of the probed lists nearest by the masked
        Hamming distance (ties: the earlier row in list order; the nearest ``nprobe`` centroids,
        ties to the lower), and every row identical to one of them, as sorted int64."""
        return self.dups.expand(self.order[self._probe(q, count, nprobe)])

    def scored_top(self, q: np.ndarray, k: int, rows: np.ndarray, root: float, threads: int = 1
                   ) -> tuple[np.ndarray, np.ndarray]:
        """The distinct rows ``propose`` would give, scored exactly (``bit_scores(rows, q) / root``:
        the table and sum of the exact scan, so bitwise its scores) and cut to the rows a top-``k``
        vote can use, twins included (``DuplicateGroups.top_rows``): (rows ascending, scores).

        One native call (``ext.ivf_search``); the lists hold the same bytes as ``rows``, so
        ``rows`` is not read. ``tests/test_ivf_index.py`` checks it against the Python steps.
        ``threads``: for the list scan; retrieval gives the engine's. With OpenMP, llama.cpp's
        workers are still spinning from the prompt decode and take the work at once; with a single
        llama.cpp thread a second one would have to be woken, which costs more than it saves
        (docs/benchmarks.md)."""
        if self._search is None:
            d = self.dups
            self._search = ext.IvfSearch(self.cent, self.starts, self.lists, self.order, *self.list_twins,
                                             d.start, d.members)
        nprobe = self.nprobe or probe_count(self.lists.shape[0], len(self.cent))
        return self._search.search(q, root, nprobe, self._count(k), k, threads)

    def scored_top_steps(self, q: np.ndarray, k: int, rows: np.ndarray, root: float) -> tuple[np.ndarray, np.ndarray]:
        """``scored_top`` by its Python steps (probe, ``bit_scores``, ``DuplicateGroups.top_rows``):
        the reference the native call is tested against."""
        pos = self._probe(q, self._count(k))
        return bit_top(self.dups, self.order[pos], rows, q, root, k, (self.list_twins[0][pos], self.list_twins[1][pos]))

    def _count(self, k: int) -> int:
        """Candidates for a top ``k`` (``CANDIDATES`` by the rows indexed, at least 16 per wanted row)."""
        return max(self._candidates, 16 * int(k))

    def _probe(self, q: np.ndarray, count: int, nprobe: int = 0) -> np.ndarray:
        """Positions in ``lists`` of the ``count`` nearest distinct rows of the probed lists."""
        if self.lists.shape[0] == 0:
            return np.zeros(0, np.int64)
        code, mask = query_code(q)
        nprobe = nprobe or self.nprobe or probe_count(self.lists.shape[0], len(self.cent))
        best = ext.masked_hamming_top(self.cent, *self._all_cent, code, mask, min(nprobe, len(self.cent)))
        return ext.masked_hamming_top(self.lists, self.starts[best], self.starts[best + 1], code, mask, int(count))

    # ------------------------------------------------------------------ build / file
    @classmethod
    def build(cls, rows: np.ndarray, kind: str = "bits", threads: int = BUILD_THREADS, seed: int = 0,
              nlist: int = 0) -> "IvfIndex":
        """An inverted file over packed rows (n, B) uint8; ``nlist`` overrides ``list_count``."""
        if kind != "bits":
            raise ValueError("an inverted file indexes packed 1-bit rows only")
        rows = np.ascontiguousarray(rows, np.uint8)
        reps, *dups = duplicate_rows(rows)
        n = reps.size
        nlist = min(int(nlist), n) if nlist else list_count(n)
        rng = np.random.default_rng(seed)
        bits = rows.shape[1] * 8
        if n == 0:
            empty = np.zeros((0, rows.shape[1]), np.uint8)
            return cls(empty, np.zeros(1, np.int64), np.zeros(0, np.int64), empty, rows.shape[0], kind, tuple(dups))
        sample = rows[np.sort(rng.choice(reps, min(n, SAMPLE_PER_LIST * nlist), replace=False))]
        cent = sample[rng.choice(len(sample), nlist, replace=False)].copy()
        for _ in range(ROUNDS):
            a = ext.hamming_nearest(sample, cent, threads)
            by = np.argsort(a, kind="stable")
            bounds = np.searchsorted(a[by], np.arange(nlist + 1))
            full = np.flatnonzero(bounds[1:] > bounds[:-1])
            signs = np.unpackbits(sample[by], axis=1, count=bits).astype(np.int32)
            votes = np.add.reduceat(signs, bounds[full], axis=0)
            sizes = (bounds[1:] - bounds[:-1])[full]
            cent[full] = np.packbits(votes * 2 >= sizes[:, None], axis=1)  # ties to 1, as codecs store 0
        assign = np.empty(n, np.int32)
        for s in range(0, n, 262_144):  # the distinct rows are gathered a slice at a time
            assign[s:s + 262_144] = ext.hamming_nearest(rows[reps[s:s + 262_144]], cent, threads)
        by = np.argsort(assign, kind="stable")
        starts = np.searchsorted(assign[by], np.arange(nlist + 1)).astype(np.int64)
        order = reps[by].astype(np.int64)
        return cls(cent, starts, order, np.ascontiguousarray(rows[order]), rows.shape[0], kind, tuple(dups))

    def _arrays(self) -> list[tuple[str, np.ndarray]]:
        d = self.dups
        return [("cent", self.cent), ("starts", self.starts), ("order", self.order), ("lists", self.lists),
                ("dup_rep", d.rep), ("dup_start", d.start), ("dup_members", d.members)]

    def save(self, path: Path, key: str) -> None:
        """Write the container atomically (``index_files.write_container``): header with a CRC32 of
        the body, then the arrays in a fixed order."""
        parts = [(name, np.ascontiguousarray(a)) for name, a in self._arrays()]
        layout, off, crc = [], 0, 0
        for name, a in parts:
            layout.append([name, a.dtype.str, list(a.shape), off])
            off += a.nbytes
            crc = zlib.crc32(memoryview(a).cast("B"), crc)
        head = {"format": _FORMAT, "key": key, "kind": self.kind, "rows": self.n_rows, "layout": layout,
                "body": off, "crc32": crc}
        write_container(path, _MAGIC, head, [memoryview(a).cast("B") for _, a in parts])

    @classmethod
    def load(cls, path: Path, key: str, rows: np.ndarray, kind: str = "bits") -> "IvfIndex":
        """Map a cache file; raises ValueError (or OSError) on anything that does not match ``key``
        and ``rows``: header, size, CRC32, shapes, and sampled rows of the lists."""
        mm, head, size = map_container(path, _MAGIC, _FORMAT, key, kind)
        if size != HEADER + head["body"]:
            raise ValueError(f"size {size} does not match its header")
        body = memoryview(mm)[HEADER:]
        if zlib.crc32(body) != head["crc32"]:
            raise ValueError("CRC32 mismatch")
        arrs = {}
        for name, dtype, shape, off in head["layout"]:
            count = int(np.prod(shape)) if shape else 1
            arrs[name] = np.frombuffer(body, np.dtype(dtype), count, off).reshape(shape)
        B = rows.shape[1]
        if head["rows"] != rows.shape[0] or arrs["lists"].shape[1:] != (B,) or arrs["cent"].shape[1:] != (B,):
            raise ValueError(f"index of {head['rows']} rows, memory has {rows.shape[0]}x{B} bytes")
        if arrs["starts"].size != arrs["cent"].shape[0] + 1 or arrs["starts"][-1] != arrs["lists"].shape[0] or \
                arrs["order"].size != arrs["lists"].shape[0]:
            raise ValueError("list bounds do not match the lists")
        ivf = cls(arrs["cent"], arrs["starts"], arrs["order"], arrs["lists"], head["rows"], kind,
                  (arrs["dup_rep"], arrs["dup_start"], arrs["dup_members"]), keep=(mm, body))
        ivf._check_sample(rows)
        return ivf

    def _check_sample(self, rows: np.ndarray, n: int = 16) -> None:
        """Compare a few listed rows with the memory's rows (a key that lied would show here)."""
        m = self.lists.shape[0]
        if m == 0:
            return
        at = np.linspace(0, m - 1, min(n, m)).astype(np.int64)
        if (self.order[at] >= rows.shape[0]).any() or not np.array_equal(rows[self.order[at]], self.lists[at]):
            raise ValueError("a listed row differs from the memory's row")
