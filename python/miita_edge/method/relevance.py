"""The relevance gate: memory steers an answer only when it has something to say.

Retrieval always finds *some* nearest anchors; on a query the memory knows nothing about (extractive
QA whose answers never repeat, a summarisation task, a task it has not learned yet) steering towards
them only makes the frozen model's answer worse. The gate keeps a retrieved prototype (one stored
answer) when the memory's own statistics say it applies to the query:

* **recurrence**: the answer was taught by at least two examples (``n_j >= 2``). One example of an
  answer is no evidence that similar inputs share it; on XQuAD every stored answer is taught once,
  on SuperNI's generation tasks too, while label-like answers recur;
* **radius**: the query, in stored form (its sign bits), is at least as close to one of the
  answer's anchors as the answer's own loneliest example was to its siblings when it was written
  (``Prototype.radius``, the lowest such similarity, kept in one byte per prototype). A query from a
  task the memory has not learned sits farther from the retrieved answer's examples than they sit
  from each other;
* **or an exact repeat**: the query's stored form equals an anchor of the answer (cosine 1): the
  memory was told this very input's answer, however often.

If no retrieved prototype passes, the frozen model answers untouched and the response says why.
Nothing here is tuned on test rows: both quantities are the memory's own, and the thresholds are
"at least two" and "as close as its own examples". docs/method.md has the measurements.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["EXACT_REPEAT", "GENERIC_QUESTIONS", "NEAREST_Z", "NULL_Z", "GateDecision", "best_per_prototype", "gate",
           "contested", "nearest_margin", "null_scores", "paraphrase_reach", "separating_threshold", "sibling_cosines"]

#: Questions and small talk that no taught answer is meant for: the gate's reference for how close
#: text the memory has nothing to say about comes to each answer's examples (``null_scores``).
#: Written for this purpose; disjoint from the test suite's off-topic prompts and from check-model's.
GENERIC_QUESTIONS = [
    "Who was the first emperor of Rome?", "How many moons does Jupiter have?", "What is a prime number?",
    "Can you tell me a story about a dragon?", "What's the weather like on Mars?", "How do magnets work?",
    "Nice to meet you!", "What should I read next?", "How old is the universe?", "What does a lighthouse do?",
    "Explain how a bicycle works.", "What is the national dish of Japan?", "Why do stars twinkle?",
    "How do I draw a cat?", "Which is bigger, a whale or an elephant?", "What rhymes with moon?",
    "Say something nice about Mondays.", "How does the heart pump blood?", "What is the capital of Brazil?",
    "Give me a word that means big.", "What do frogs eat?", "How are clouds formed?", "What is jazz?",
    "Who invented the printing press?", "What is the speed of sound?", "Do you dream?",
    "How many sides does a triangle have?", "What is the longest word you know?", "Why do dogs wag their tails?",
    "Recommend a song for a rainy day.", "What is the difference between a frog and a toad?",
    "How do volcanoes erupt?", "What is the oldest tree in the world?", "Good night!",
    "How many players are in a chess game?", "What is a sonnet?", "Why is grass green?",
    "What is the population of the moon?", "How do you make bread rise?", "What is the meaning of life?",
]

#: A cosine this close to 1 between sign vectors means every bit is equal (1 - 2/H for one flip).
EXACT_REPEAT = 1.0 - 1e-6


@dataclass(frozen=True)
class GateDecision:
    keep: np.ndarray  # (m,) bool: which of the retrieved prototypes may steer
    reason: str | None  # why nothing steers (None when something does)
    # the position in ids of the answer nearest the query where the paraphrase reach alone trusts it
    # (no exact repeat, no radius test passed), else -1: what method/verify checks
    reach_lead: int = -1
    # the position in ids of the answer nearest the query where its trust is left to the model's
    # reading (``readable``: its taught inputs kept; no exact repeat; the general-question tests
    # passed), else -1: nothing steers until method/verify's ``read_confirmed`` says so
    read_lead: int = -1

    @property
    def adapted(self) -> bool:
        return bool(self.keep.any())


def best_per_prototype(scores: np.ndarray, owner: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """For each prototype in ``ids``, its anchors' highest score (-inf if it has no anchor).

    ``scores`` (A,) and ``owner`` (A,) describe the anchor rows; brute force over the rows of the
    asked prototypes, so it is the reference for any faster path."""
    out = np.full(len(ids), -np.inf)
    for i, j in enumerate(ids):
        s = scores[owner == j]
        if len(s):
            out[i] = float(s.max())
    return out


#: The null score sits this many standard deviations above the generic questions' mean best cosine:
#: the one-sided normal tail of 1 in 1,000, the share of questions the memory has nothing to say
#: about that may still pass one answer's test (never below the highest generic question itself).
#: Versions 5-8 of the default preset.
NULL_Z = 3.09


#: The tail of the per-answer null score when the nearest-question test (``nearest_margin``) also
#: applies (version 9): one in 20, uncapped. Each test alone lets through what the other stops
#: (docs/method.md, "The relevance gate", has the trade-off on two models and two off-topic sets).
NEAREST_Z = 1.64


def null_scores(generic_best: np.ndarray, z: float = NULL_Z, cap: bool = True) -> np.ndarray:
    """Each prototype's null score, from ``generic_best`` (G, J), generic question g's best cosine to
    prototype j's anchors: mean_j + z·std_j (and, with ``cap``, never below max_g): how near text it
    has nothing to say about may come, extrapolated from G such questions to a one-sided normal tail
    (z = 3.09: 1 in 1,000; 1.64: 1 in 20)."""
    g = np.asarray(generic_best, np.float64)
    if not g.size:
        return np.full(g.shape[1:], -np.inf)
    out = g.mean(axis=0) + z * g.std(axis=0)
    return np.maximum(out, g.max(axis=0)) if cap else out


def nearest_margin(query_bits: np.ndarray, generic_bits: np.ndarray, key_dim: int) -> float:
    """The cosine a retrieved answer's nearest anchor must beat under the nearest-question test: the
    query's cosine to its nearest generic question, plus 1/sqrt(K), one standard deviation of the
    cosine of two unrelated sign vectors of K bits.

    Why: the per-answer null score asks how near general questions come to an answer *on
    average*, and on a model whose keys put a memory's topic close to everyday questions
    (SmolLM2-135M) that threshold is high enough to decline a quarter of the on-topic paraphrases.
    Asking instead whether *this* query is nearer to the answer than to the question it most
    resembles separates the two per query: an off-topic question usually has a near generic
    sibling, an on-topic one does not (docs/method.md, "The relevance gate"). Brute force over the packed rows:
    ``query_bits`` (ceil(K/8),) and ``generic_bits`` (G, ceil(K/8)) as np.packbits writes them."""
    g = np.unpackbits(np.asarray(generic_bits, np.uint8), axis=1)[:, :key_dim]
    q = np.unpackbits(np.asarray(query_bits, np.uint8))[:key_dim]
    if not len(g):
        return -np.inf
    d = int((g != q).sum(axis=1).min())
    return (key_dim - 2 * d) / key_dim + 1.0 / np.sqrt(key_dim)


def paraphrase_reach(bits: np.ndarray, groups: np.ndarray, key_dim: int) -> float:
    """How near a paraphrase comes, on this model, in stored form: the cosine that best separates
    each phrasing's nearest sibling from its nearest non-sibling (the threshold that maximises the
    share of siblings at or above it minus the share of non-siblings at or above it), over
    ``bits`` (N, ceil(K/8)), the packed sign bits of paraphrase groups (``groups`` (N,), each
    phrasing's group) prepared as the memory prepares keys.

    Why: one taught example is evidence for its own neighbourhood, and how far a neighbourhood
    reaches is what the model says about paraphrase, not how often an answer was taught. Derived
    from the model and the memory's key frame alone; no constant is chosen. Brute force over the
    pairs (a few hundred phrasings), one product of their ±1 vectors."""
    return separating_threshold(*sibling_cosines(bits, groups, key_dim))


def sibling_cosines(bits: np.ndarray, groups: np.ndarray, key_dim: int, rows: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(nearest sibling's cosine, nearest non-sibling's cosine) of each phrasing in ``rows`` (a
    boolean mask; default all), against every other phrasing of ``bits``; phrasings without a
    sibling or a non-sibling are left out."""
    s = _signs(bits, key_dim, np.float64)
    groups = np.asarray(groups)
    cos = (s @ s.T) / key_dim  # ±1 vectors: the dot product is K - 2·Hamming, exact in float64
    np.fill_diagonal(cos, -np.inf)
    same = groups[:, None] == groups[None, :]
    sib = np.where(same, cos, -np.inf).max(axis=1)
    non = np.where(~same, cos, -np.inf).max(axis=1)
    if rows is not None:
        sib, non = sib[np.asarray(rows, bool)], non[np.asarray(rows, bool)]
    return sib[np.isfinite(sib)], non[np.isfinite(non)]


def _signs(bits: np.ndarray, key_dim: int, dtype) -> np.ndarray:
    """The ±1 vectors of packed sign bits (N, ceil(K/8)), their first ``key_dim`` coordinates."""
    return np.unpackbits(np.asarray(bits, np.uint8), axis=1)[:, :key_dim].astype(dtype) * 2 - 1


def separating_threshold(sib: np.ndarray, non: np.ndarray) -> float:
    """The cosine t that maximises the share of ``sib`` at or above t minus the share of ``non`` at
    or above it (ties: the lowest); inf when either is empty."""
    if not len(sib) or not len(non):
        return np.inf
    best, best_j = np.inf, -np.inf
    for t in np.unique(np.concatenate([sib, non])):
        j = (sib >= t).mean() - (non >= t).mean()
        if j > best_j:  # ascending thresholds: ties keep the lowest
            best, best_j = float(t), j
    return best


def contested(packed: np.ndarray, owner: np.ndarray, n_prototypes: int, key_dim: int, reach: float,
              chunk: int = 1024) -> np.ndarray:
    """(J,) bool: prototype j is contested when one of its stored anchors and an anchor of another
    prototype are at least ``reach`` near each other (cosine of their K sign bits, (K - 2·Hamming)/K).

    Why: ``paraphrase_reach`` says how near a paraphrase comes on this model. Two examples of
    different answers that near each other are, by the model's own account, as alike as two
    phrasings of one request, so nearness to either says nothing about which answer a query wants
    (questions about one paragraph, instances of one task under its long instruction, two facts
    asked alike). An answer taught once is then no evidence for the neighbourhood it shares. No
    constant: the reach is the one the gate already uses. Exact over every pair, in chunks of
    ``chunk`` rows (±1 products in float32 are exact integers for K < 2^24)."""
    packed = np.asarray(packed, np.uint8)
    owner = np.asarray(owner, np.int64)
    out = np.zeros(int(n_prototypes), bool)
    if len(packed) < 2 or not np.isfinite(reach):
        return out
    s = _signs(packed, key_dim, np.float32)
    bar = reach * key_dim - 1e-3  # cos >= reach  <=>  dot >= reach·K (dots are integers)
    for a in range(0, len(s), chunk):
        dots = s[a:a + chunk] @ s.T
        near = (dots >= bar) & (owner[a:a + chunk, None] != owner[None, :])
        rows = np.flatnonzero(near.any(axis=1))
        out[owner[a + rows]] = True
    return out


def gate(ids: np.ndarray, best: np.ndarray, counts: np.ndarray, radius: np.ndarray,
         null: np.ndarray | None = None, floor: float = -np.inf, reach: float | None = None,
         abstain: bool = False, reach_every: bool = False, near: np.ndarray | None = None,
         contest: np.ndarray | None = None, answer: np.ndarray | None = None,
         margin: float = 0.0, readable: np.ndarray | None = None) -> GateDecision:
    """The gate's decision for the retrieved prototypes ``ids``.

    ``best`` (m,): each one's highest cosine between the query's sign vector and its anchors;
    ``counts`` (J,): every prototype's n; ``radius`` (J,): every prototype's radius; ``null`` (J,),
    if given: every prototype's null score (``null_scores``): a query must also come nearer than
    any generic question does, so a memory whose examples share a template's instruction, where
    radii are wide, still leaves questions it has nothing to say about alone; ``floor``, the
    query's own bar (``nearest_margin``): every answer must also beat it.

    ``reach`` (``paraphrase_reach``), if given: an answer taught once is trusted where the query
    is at least that near to its example (and beats the same null and floor), not only on an
    exact repeat; with ``reach_every``, so is an answer taught more than once (beside its radius
    test). ``near`` (m,), if given: the scores the null and the floor are compared with instead of
    ``best`` (the float query against stored bits); the radius, the reach and an exact repeat
    still read ``best``. ``abstain``: where the retrieved answer nearest to the query (its best cosine;
    ties: the first) is not trusted, nothing steers: the vote never hands a query to another
    answer because the one it resembles most was declined. ``contest`` (J,), if given: every
    prototype's ``contested`` flag; a contested answer is not trusted by the reach (an exact
    repeat still is). ``margin`` with ``answer`` (m,), each retrieved prototype's answer id: where
    the answer nearest to the query is trusted by the reach alone (no exact repeat, no radius test
    passed), it must lead every other retrieved answer's best cosine by at least ``margin``, or
    nothing steers: one example's neighbourhood decides its answer only where no other answer's
    example is about as near. ``readable`` (J,), if given: the answers whose trust the model's reading
    decides instead of the reach and the radius (their taught inputs kept: method/verify); where the nearest
    answer is one of them, is no exact repeat and passes the general-question tests, the decision
    keeps nothing and names it in ``read_lead`` for the reading; where it fails those tests, nothing
    steers, as for any untrusted nearest answer."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    best = np.asarray(best, np.float64).reshape(-1)
    if len(ids) == 0:
        return GateDecision(np.zeros(0, bool), "the memory retrieved nothing")
    # a handful of retrieved prototypes: plain Python (each numpy call on them costs more than
    # the comparisons right after a prompt pass)
    n = np.asarray(counts)[ids].tolist()
    r = np.asarray(radius, np.float64)[ids].tolist()
    b = best.tolist()
    z = np.asarray(null, np.float64)[ids].tolist() if null is not None else [-np.inf] * len(b)
    if floor > -np.inf:
        z = [max(zj, floor) for zj in z]
    # the general-question tests read ``near`` where given (``gate_query`` "float"), else ``best``
    g = np.asarray(near, np.float64).reshape(-1).tolist() if near is not None else b
    recurring = [x >= 2 for x in n]
    keep = [bj >= EXACT_REPEAT or (rec and bj >= rj and gj > zj) for bj, gj, rec, rj, zj in zip(b, g, recurring, r, z)]
    c = np.asarray(contest, bool)[ids].tolist() if contest is not None else [False] * len(b)
    rd = np.asarray(readable, bool)[ids].tolist() if readable is not None else [False] * len(b)
    if reach is not None:
        keep = [k or ((reach_every or not rec) and not cj and not rj and bj >= reach and gj > zj)
                for k, bj, gj, rec, cj, zj, rj in zip(keep, b, g, recurring, c, z, rd)]
    lead = max(range(len(b)), key=lambda i: (b[i], -i))  # the retrieved answer nearest the query (ties: the first)
    if rd[lead] and b[lead] < EXACT_REPEAT:
        if g[lead] > z[lead]:
            return GateDecision(np.zeros(len(b), bool), "left to the model's reading", read_lead=lead)
        return GateDecision(np.zeros(len(b), bool),
                            f"not relevant: the query is no nearer to the nearest answer's example (best cosine "
                            f"{g[lead]:.3f}) than general questions come (up to {z[lead]:.3f})")
    by_reach = keep[lead] and b[lead] < EXACT_REPEAT and not (recurring[lead] and b[lead] >= r[lead]
                                                              and g[lead] > z[lead])
    if margin > 0 and answer is not None and any(keep):
        a = np.asarray(answer).reshape(-1).tolist()
        rival = max((b[i] for i in range(len(b)) if a[i] != a[lead]), default=-np.inf)
        if by_reach and b[lead] - rival < margin:
            return GateDecision(np.zeros(len(b), bool),
                                f"not decided: the nearest answer (best cosine {b[lead]:.3f}) leads another "
                                f"answer ({rival:.3f}) by less than {margin:g}")
    if abstain and any(keep):
        if not keep[lead]:
            return GateDecision(np.zeros(len(b), bool),
                                f"the answer nearest to the query (best cosine {b[lead]:.3f}) is not trusted, "
                                f"so no other answer steers in its place")
    if any(keep):
        return GateDecision(np.array(keep, bool), None, lead if by_reach else -1)
    shared = [i for i in range(len(b)) if c[i] and reach is not None and b[i] >= reach and g[i] > z[i]]
    if shared:
        j = max(shared, key=lambda i: (b[i], -i))
        why = (f"not decided: the query is near an example (best cosine {b[j]:.3f}) whose neighbourhood holds "
               f"another answer's example as near as a paraphrase comes ({reach:.3f})")
    elif not any(recurring) and reach is not None:
        j = max(range(len(b)), key=lambda i: (b[i], -i))
        why = (f"not relevant: the query is no nearer to the retrieved answers' examples (best cosine {b[j]:.3f}) "
               f"than a paraphrase reaches on this model ({reach:.3f}), or general questions come as near")
    elif not any(recurring):
        why = "no recurring answer: each retrieved answer was taught by one example only"
    elif all(gj <= zj for gj, rec, zj in zip(g, recurring, z) if rec):
        j = max((i for i in range(len(b)) if recurring[i]), key=lambda i: (g[i] - z[i], -i))
        why = (f"not relevant: the query is no nearer to the retrieved answers' examples (best cosine "
               f"{g[j]:.3f}) than general questions come (up to {z[j]:.3f})")
    else:
        j = max((i for i in range(len(b)) if recurring[i]), key=lambda i: (b[i] - r[i], -i))
        why = (f"not relevant: the query is farther from the retrieved answers' examples (best cosine "
               f"{b[j]:.3f}) than they are from each other (radius {r[j]:.3f})")
    return GateDecision(np.array(keep, bool), why)
