"""An approximate nearest-neighbour front for the recall scans of large memories.

Why: an exact scan reads every stored key per query, so retrieval grows linearly with the memory
(docs/benchmarks.md has its cost against a prompt pass). A usearch HNSW graph over the same rows
finds a query's neighbourhood in far less, but only approximately. So the graph never decides anything: it *proposes* a candidate set larger than
what retrieval needs (``SEARCH``: e.g. 256 rows for the 8 anchors of the default preset's
vote at 100,000 keys, 512 at 1,000,000), and the candidates are re-scored exactly by the existing code. The final selection is
then the exact scan's whenever the true top set is among the candidates (recall is measured by
``bench/ann.py``; docs/benchmarks.md).

Which index: for packed 1-bit rows (the default preset's vote) the front is now an inverted file
(``ivf_index.IvfIndex``, ``BITS_FRONT``): after a prompt pass has evicted the caches, a graph walk's
dependent reads cost more than reading a few contiguous lists at the same recall (docs/benchmarks.md).
The usearch graph stays the front of float rows (the
paper preset) and the measured alternative for bits (``BITS_FRONT = "graph"``). ``AnnFront``,
the cache and ``front`` serve both.

What the graph indexes (the re-score is always the exact scan's own score):

* ``"bits"``: packed 1-bit rows (the default preset's vote: its anchors, then each answer's
  centroid). The exact score is the *float* query against the ±1 rows, Σ|q_i|·s_i·a_i; Hamming
  distance to the query's signs alone weighs every dimension alike, and at 1,000,000 one-layer
  640-bit keys the exact top-8 were then among the Hamming top-512 for only 93% of real queries
  (top-2,048: 99%). So each key bit is stored twice (2·H bits) and the query codes its stronger
  half of dimensions (|q_i| at or above the median) as (s_i, s_i), its weaker half as (s_i, ¬s_i),
  which adds the same 1 to every key's distance: the Hamming distance then counts disagreements on
  the strong half only, twice, and the exact top-8 were among its top-512 for 99.9% of those
  queries. With two-layer 1,280-bit keys: recall@256 1.000 at 100,000
  prototypes, recall@512 0.984 at 1,000,000 (below the 0.99 target; docs/benchmarks.md);
* ``"f16"``: float rows stored as float16, cosine (the paper preset's unit anchors and
  directions). Not int8: the paper preset's keys are not centred, and real ones lie in a narrow
  cone (cosine 0.9997 between keys of one Banking77 label, 0.9996 between any two), so int8
  rounding hides their differences — recall@64 of the exact top-8 was 0.19 with int8, 1.00 with
  float16, on 30,000 keys drawn around real ones (docs/benchmarks.md).

Identical rows are indexed once: a candidate row brings every row equal to it, so a tie among
duplicates (two prototypes stored with the same key) is broken by the exact path's rule (lower
index), not by which duplicate the graph happened to return.

Where it lives: derived from the stored keys, never stored in the memory (it costs no budget
bytes), cached in the user cache directory under a key derived from the memory version's content
(the CRC32 of its arrays in the store manifest), and memory-mapped on the next open. A cache file
is one container (``_MAGIC`` header with a CRC32 of the rest, then usearch's own serialisation,
then the duplicate groups); it is written to a temporary file and ``os.replace``-d, so two
processes building the same cache cannot corrupt it, and it is verified (size, CRC32, row count,
dimensions, sampled rows) before usearch maps it, so a damaged file is rebuilt, never trusted.

When it is used: from ``MIN_ROWS`` rows on (above the measured crossover against the exact scan;
``MIN_ROWS_FLOAT`` for the paper preset's float rows; below it nothing changes, same code path as
before) and when usearch is installed (the optional
extra ``pip install ".[index]"``); otherwise retrieval silently uses the exact scan. A graph that
is not cached is built on a background thread (1 thread) while the exact scan answers, so an open
stays interactive: at 1,000,000 default-preset prototypes (1,000,000 distinct rows) a build took
3.3 minutes on clustered keys and 20 on uniform ones (docs/benchmarks.md).
"""
from __future__ import annotations

import json
import hashlib
import logging
import os
import threading
import time
import zlib
from pathlib import Path

import numpy as np

from ..runtime.fingerprint import cache_dir as user_cache
from . import ivf_index as ivf
from .exact_scores import ExactOnDemand, bit_top
from .index_files import HEADER, DuplicateGroups, duplicate_rows, map_container, strong_half, write_container
from .ivf_index import IvfIndex

__all__ = ["AnnFront", "AnnIndex", "AnnScores", "MIN_ROWS", "MIN_ROWS_FLOAT", "SEARCH", "available", "cache_dir",
           "front", "min_rows", "search_params", "status"]

log = logging.getLogger("miita_edge.ann")

#: rows a graph would index (default preset: voter rows, anchors + centroids) from which it is
#: used (below: the exact scan, unchanged): above the crossover with two-layer
#: 1,280-bit rows, ~15,000 voter rows (bench/ann.py --crossover; docs/benchmarks.md)
MIN_ROWS = 20_000
#: the same for float rows (the paper preset, rows per channel), never below MIN_ROWS. Its graph
#: beats the exact scans on smaller memories, but its direction channel finds too little of the
#: exact Top_R there (docs/benchmarks.md): it keeps the threshold it had before the
#: crossover moved, so paper memories under 50,000 rows stay exact
MIN_ROWS_FLOAT = 50_000
#: by kind: (from this many rows, candidates proposed, search breadth usearch ``expansion_search``),
#: the last row whose size is reached applies; at least 16 candidates per wanted row. Measured on
#: clustered real-like keys (bench/ann.py): a wider search buys recall at 1,000,000 prototypes
#: (2,000,000 voter rows): breadth 1,024 found 0.984 of the exact top 8 whether 512 or 1,024
#: candidates were kept, breadth 2,048 found 0.995 (docs/benchmarks.md)
SEARCH = {"bits": ((0, 256, 256), (500_000, 512, 2048)), "f16": ((0, 128, 128),)}
#: the front of packed 1-bit rows (the default preset's vote): "ivf", the inverted file of
#: method/ivf_index.py (the cheaper plan, docs/benchmarks.md), or "graph", the usearch graph it replaced
BITS_FRONT = "ivf"
#: graph degree and build breadth (usearch ``connectivity``, ``expansion_add``)
CONNECTIVITY = 32
EXPANSION_ADD = 128
#: threads of a build (a background build leaves the other core to the prompt pass)
BUILD_THREADS = 1
#: bytes the cache directory may hold; the least recently used files go first
CACHE_MAX_BYTES = 4 << 30

#: what a graph indexes: kind -> (usearch metric, usearch scalar)
KINDS = {"bits": ("hamming", "b1"), "f16": ("cos", "f16")}

_MAGIC = b"MIITAANN"
_FORMAT = 1  # bump when the container or the derivation of the indexed rows changes


def search_params(kind: str, n_rows: int, k: int) -> tuple[int, int]:
    """(candidates, search breadth) of a graph over ``n_rows`` rows when retrieval needs the top ``k``."""
    count, ef = next((c, e) for start, c, e in reversed(SEARCH[kind]) if n_rows >= start)
    count = max(count, 16 * int(k))
    return count, max(ef, count)


def index_class(kind: str):
    """The index that fronts rows of ``kind``: packed bits get the inverted file
    (``BITS_FRONT = "ivf"``, method/ivf_index.py), float rows the usearch graph."""
    if kind == "bits" and BITS_FRONT == "ivf":
        return IvfIndex
    return AnnIndex


def available(kind: str) -> bool:
    """Whether a front for ``kind`` can be built: the inverted file always; the usearch graph when
    usearch can be imported (the optional ``index`` extra)."""
    if index_class(kind) is not AnnIndex:
        return True
    try:
        import usearch.index  # an optional extra (pip install ".[index]"): looked up, not required  # noqa: F401
    except Exception:  # ImportError, or a broken binary wheel: either way, the exact scan
        return False
    return True


def cache_dir() -> Path:
    """Where graphs are cached: ``<user cache dir>/miita-edge/ann`` (``MIITA_EDGE_ANN_CACHE`` overrides)."""
    env = os.environ.get("MIITA_EDGE_ANN_CACHE")
    if env:
        return Path(env).expanduser()

    return user_cache() / "ann"


def min_rows(kind: str) -> int:
    """Rows from which a graph of ``kind`` is used."""
    return MIN_ROWS if kind == "bits" else max(MIN_ROWS, MIN_ROWS_FLOAT)


def status(n_rows: int, kind: str = "bits") -> str:
    """One line saying which recall a memory whose graph would index ``n_rows`` rows of ``kind``
    uses (``miita-edge info``)."""
    limit = min_rows(kind)
    if n_rows < limit:
        return f"exact scan ({n_rows} rows < {limit})"
    if not available(kind):
        return 'exact scan (usearch not installed: pip install ".[index]")'
    what = "usearch HNSW front" if index_class(kind) is AnnIndex else "inverted-file front"
    return f"{what}, its candidates re-scored exactly ({n_rows} rows >= {limit})"


# ----------------------------------------------------------------------------- rows
def _query_vector(q: np.ndarray, kind: str) -> np.ndarray:
    """A float query as the graph's vectors are stored: signs packed, or float (usearch rounds)."""
    q = np.asarray(q, np.float32).reshape(-1)
    if kind != "bits":
        return q
    s, strong = strong_half(q)
    return np.packbits(np.stack([s, np.where(strong, s, ~s)], axis=1).reshape(-1))


def _graph(kind: str, ndim: int, **params):
    from usearch.index import Index  # the optional extra, present once available() said so

    if kind not in KINDS:
        raise ValueError(f"unknown ann kind {kind!r}")
    metric, dtype = KINDS[kind]
    return Index(ndim=ndim, metric=metric, dtype=dtype, **params)


def _ndim(rows: np.ndarray, kind: str) -> int:
    return rows.shape[1] * 16 if kind == "bits" else rows.shape[1]


def _stored(rows: np.ndarray, kind: str) -> np.ndarray:
    """Rows as the graph holds them (what a cached graph's vectors are compared with)."""
    if kind != "bits":
        return np.asarray(rows, np.float16)
    return np.packbits(np.repeat(np.unpackbits(rows, axis=1), 2, axis=1), axis=1)  # every bit twice


# ----------------------------------------------------------------------------- index
class AnnIndex:
    """A usearch graph over one matrix's distinct rows; ``candidates`` proposes row ids.

    ``graph`` is a ``usearch.index.Index`` (built, or viewed from a cache file whose buffer
    ``keep`` holds); ``dups`` = (rep, start, members): rows identical to a representative.
    """

    kind_suffix = ".usearch"

    def __init__(self, graph, n_rows: int, kind: str, dups, keep=None) -> None:
        self.graph, self.n_rows, self.kind, self.keep = graph, int(n_rows), kind, keep
        self.dups = DuplicateGroups(*dups, n_rows=self.n_rows)
        self.ef = 0  # search breadth override (benchmarks set it to show a miss); 0: search_params'

    def propose(self, q: np.ndarray, k: int) -> np.ndarray:
        """Candidates for a top ``k``, as many as ``search_params`` says for this graph's size."""
        return self.candidates(q, *search_params(self.kind, self.n_rows, k))

    def candidates(self, q: np.ndarray, count: int, ef: int = 0) -> np.ndarray:
        """Row ids near ``q`` (float, shape (ndim,)): about ``count`` distinct rows and every row
        identical to one of them, as sorted int64; ``ef``: the search breadth (default ``count``)."""
        return self.dups.expand(self._search(q, count, ef))

    def scored_top(self, q: np.ndarray, k: int, rows: np.ndarray, root: float, threads: int = 1
                   ) -> tuple[np.ndarray, np.ndarray]:
        """The distinct rows ``propose`` would give, scored exactly (``bit_scores(rows, q) / root``)
        and cut to the rows a top-``k`` vote can use, twins included (``DuplicateGroups.top_rows``):
        (rows ascending, scores). Packed 1-bit rows only (the recall front of the vote); the graph
        searches on one thread whatever ``threads`` is."""
        return bit_top(self.dups, self._search(q, *search_params(self.kind, self.n_rows, k)), rows, q, root, k)

    def _search(self, q: np.ndarray, count: int, ef: int = 0) -> np.ndarray:
        ef = self.ef or max(int(ef), int(count))
        if self.graph.expansion_search != ef:
            self.graph.expansion_search = ef
        return self.graph.search(_query_vector(q, self.kind), int(count), threads=1).keys.astype(np.int64)

    # ------------------------------------------------------------------ build / file
    @classmethod
    def build(cls, rows: np.ndarray, kind: str, threads: int = BUILD_THREADS) -> "AnnIndex":
        """A graph over ``rows``: (n, ndim/8) uint8 packed bits, or (n, ndim) float."""
        reps, *dups = duplicate_rows(rows)
        graph = _graph(kind, _ndim(rows, kind), connectivity=CONNECTIVITY, expansion_add=EXPANSION_ADD)
        for i in range(0, reps.size, 65536):  # in slices: the stored form of 1M rows would be a copy
            r = reps[i:i + 65536]
            graph.add(r.astype(np.uint64), np.ascontiguousarray(_stored(rows[r], kind)), threads=threads)
        return cls(graph, rows.shape[0], kind, tuple(dups))

    def save(self, path: Path, key: str) -> None:
        """Write the container to ``path`` atomically (temporary file + os.replace)."""
        payload = bytes(self.graph.save())
        d = self.dups
        dups = b"".join(a.astype("<i8").tobytes() for a in (d.rep, d.start, d.members))
        body = payload + dups
        head = {"format": _FORMAT, "key": key, "kind": self.kind, "rows": self.n_rows, "nodes": int(self.graph.size),
                "ndim": int(self.graph.ndim), "payload": len(payload),
                "dups": [int(d.rep.size), int(d.start.size), int(d.members.size)],
                "body": len(body), "crc32": zlib.crc32(body)}
        write_container(path, _MAGIC, head, [body])

    @classmethod
    def load(cls, path: Path, key: str, rows: np.ndarray, kind: str) -> "AnnIndex":
        """Map a cache file; raises ValueError (or OSError) on anything that does not match
        ``key`` and ``rows`` exactly — header, size, CRC32, counts, dimensions, sampled rows."""
        mm, head, size = map_container(path, _MAGIC, _FORMAT, key, kind)
        n_rep, n_start, n_mem = head["dups"]
        if size != HEADER + head["body"] or head["body"] != head["payload"] + 8 * (n_rep + n_start + n_mem):
            raise ValueError(f"size {size} does not match its header")
        body = memoryview(mm)[HEADER:]
        if zlib.crc32(body) != head["crc32"]:
            raise ValueError("CRC32 mismatch")
        ndim = _ndim(rows, kind)
        if head["rows"] != rows.shape[0] or head["ndim"] != ndim:
            raise ValueError(f"index of {head['rows']}x{head['ndim']}, memory has {rows.shape[0]}x{ndim}")
        graph = _graph(kind, ndim)
        graph.view(body[:head["payload"]])
        if graph.size != head["nodes"] or graph.ndim != ndim:
            raise ValueError("usearch header does not match")
        off = head["payload"]
        arrs = []
        for n in (n_rep, n_start, n_mem):
            arrs.append(np.frombuffer(body, "<i8", n, off).astype(np.int64))
            off += 8 * n
        ann = cls(graph, rows.shape[0], kind, tuple(arrs), keep=(mm, body))
        ann._check_sample(rows)
        return ann

    def _check_sample(self, rows: np.ndarray, n: int = 16) -> None:
        """Compare a few indexed vectors with the memory's rows (a key that lied would show here)."""
        if self.graph.size == 0:
            return
        keys = np.asarray(self.graph.keys)[np.linspace(0, self.graph.size - 1, min(n, self.graph.size)).astype(np.int64)]
        got = self.graph.get(keys.astype(np.uint64))
        for k, v in zip(keys.tolist(), got if isinstance(got, tuple) else [got]):
            want = _stored(rows[int(k):int(k) + 1], self.kind).reshape(-1)
            if v is None or not np.array_equal(np.asarray(v, want.dtype).reshape(-1), want):
                raise ValueError(f"row {k} differs from the indexed vector")


# ----------------------------------------------------------------------------- front
class AnnFront:
    """What retrieval holds for one matrix of a memory version: ``ready()`` is the graph once it
    is loaded or built, None before (the exact scan answers meanwhile).

    ``key``: the cache key of these rows (None: not cached, e.g. a bank that was not committed).
    ``background``: build a missing graph on a thread; False builds it in the call (tests,
    benchmarks).
    """

    def __init__(self, rows: np.ndarray, kind: str, key: str | None, background: bool = True) -> None:
        self.rows, self.kind, self.key = rows, kind, key
        self.index_cls = index_class(kind)
        self.path = None if key is None else cache_dir() / f"{key}{self.index_cls.kind_suffix}"
        self._ann: AnnIndex | None = None
        self.state = "new"  # new | cached | building | built | failed: why
        self.open_s = self.build_s = float("nan")
        self._thread: threading.Thread | None = None
        self._load()
        if self._ann is None:
            if background:
                self.state = "building"
                # Not a daemon: the interpreter waits for the build at exit. A daemon thread still
                # inside usearch's C++ build when the process ended aborted it ("terminate called
                # without an active exception", exit 134: tests/test_ann_index.py); waiting also
                # leaves the graph cached for the next open.
                self._thread = threading.Thread(target=self._build, name="miita-ann-build", daemon=False)
                self._thread.start()
            else:
                self._build()

    def ready(self) -> AnnIndex | None:
        return self._ann

    def wait(self, timeout: float | None = None) -> AnnIndex | None:
        """Block until a background build has finished (tests and benchmarks)."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self._ann

    def _load(self) -> None:
        if self.path is None:
            return
        t0 = time.perf_counter()
        try:
            self._ann = self.index_cls.load(self.path, self.key, self.rows, self.kind)
        except FileNotFoundError:
            return
        except Exception as exc:  # damaged, foreign or unreadable: rebuild; never trust it
            log.warning("ann cache %s unusable (%s); rebuilding", self.path.name, str(exc)[:120])
            return
        self.open_s = time.perf_counter() - t0
        self.state = "cached"
        try:
            os.utime(self.path)  # least recently used goes first when the cache is pruned
        except OSError:
            pass
        log.debug("ann %s: mapped from cache in %.1f ms", self.path.name, self.open_s * 1e3)

    def _build(self) -> None:
        t0 = time.perf_counter()
        try:
            ann = self.index_cls.build(self.rows, self.kind)
        except Exception as exc:  # the exact scan stays in charge
            self.state = f"failed: {str(exc)[:120]}"
            log.warning("ann build failed (%s); the exact scan answers", str(exc)[:120])
            return
        self.build_s = time.perf_counter() - t0
        if self.path is not None:
            try:
                ann.save(self.path, self.key)
                _prune(self.path.parent, keep=self.path)
            except OSError as exc:  # a cache that cannot be written is skipped
                log.debug("ann cache not written (%s)", exc)
        self._ann = ann
        self.state = "built"
        log.debug("ann: built %d rows in %.1f s", self.rows.shape[0], self.build_s)


def _prune(folder: Path, keep: Path) -> None:
    """Delete the least recently used cache files beyond CACHE_MAX_BYTES, and stale temporaries."""
    now = time.time()
    files = []
    for p in folder.iterdir():
        try:
            st = p.stat()
        except OSError:
            continue
        if p.name.endswith(".tmp"):
            if now - st.st_mtime > 86400:
                p.unlink(missing_ok=True)
        elif p.suffix in (".usearch", ".ivf"):
            files.append((st.st_mtime, st.st_size, p))
    total = sum(s for _, s, _ in files)
    for _, s, p in sorted(files, key=lambda t: t[0]):
        if total <= CACHE_MAX_BYTES:
            break
        if p != keep:
            p.unlink(missing_ok=True)
            total -= s


def content_key(entries: dict | None, channel: str, kind: str, n_rows: int, ndim: int) -> str | None:
    """The cache key of one matrix of a memory version: its store entries (dtype, shape, CRC32 of
    every array), the channel, and what shapes the graph. None without entries (not cached)."""
    if not entries:
        return None

    try:
        import usearch  # the optional extra: its major version is part of the cache key when present

        uver = usearch.__version__.split(".")[0]
    except Exception:
        uver = "?"
    ident = {"entries": {n: [e.get("dtype"), e.get("shape"), e.get("crc32")] for n, e in sorted(entries.items())},
             "channel": channel, "kind": kind, "rows": int(n_rows), "ndim": int(ndim), "format": _FORMAT,
             "usearch": uver, "graph": [CONNECTIVITY, EXPANSION_ADD]}
    if index_class(kind) is not AnnIndex:
        del ident["usearch"], ident["graph"]
        ident["ivf"] = [ivf._FORMAT, ivf.LISTS_PER_SQRT, ivf.SAMPLE_PER_LIST, ivf.ROUNDS]
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]
    return f"{channel}-{digest}"


def front(rows: np.ndarray, kind: str, entries: dict | None, channel: str, background: bool = True
          ) -> AnnFront | None:
    """The graph front for ``rows``, or None when the exact scan should answer alone: fewer than
    ``min_rows(kind)`` rows (then nothing changes), or (float rows) usearch not installed."""
    n = int(rows.shape[0])
    if n < min_rows(kind) or not available(kind):
        log.debug("recall: %s", status(n, kind))
        return None
    ndim = _ndim(rows, kind)
    return AnnFront(rows, kind, content_key(entries, channel, kind, n, ndim), background=background)


class AnnScores(ExactOnDemand):
    """One recall channel of eq. 8 through the graph, with ``RecallScores``' interface (``top``,
    ``at``, ``full``): ``top(R)`` takes the graph's candidate rows, maps them to prototypes
    (``owners``: the prototype of each row, None: rows are prototypes), re-scores those exactly
    with ``exact(ids)`` (the scan's own re-score) and keeps the best R (ties -> lower id). Equal
    to the exact ``Top_R`` whenever the true top R are among the candidates."""

    def __init__(self, ann: AnnIndex, u: np.ndarray, owners: np.ndarray | None, n: int, exact) -> None:
        self.ann, self.u, self.owners, self.n, self.exact = ann, u, owners, n, exact
        self._seen: dict[int, float] = {}

    def top(self, R: int) -> np.ndarray:
        if R <= 0:
            return np.zeros(0, dtype=np.int64)
        count, ef = search_params(self.ann.kind, self.ann.n_rows, R)
        while True:
            rows = self.ann.candidates(self.u, count, ef)
            cand = rows if self.owners is None else np.unique(self.owners[rows])
            # several anchors of one prototype may fill the candidates: widen until R prototypes
            if cand.size >= R or count >= self.ann.n_rows:
                break
            count, ef = 4 * count, 4 * ef
        return self.rescore_top(cand, R)
