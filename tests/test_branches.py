"""runtime.branches.decode_branches: several continuations of the held prompt in one llama_decode, each as
if it alone were appended (against a fresh one-branch decode of each), the cache left holding the
prompt; and a context with branch sequences decodes its main sequence bitwise as a one-sequence
context does (the keys' exact-repeat rule depends on it)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from miita_edge.runtime.branches import decode_branches, prefix_tree

PROMPT = "Classify the banking customer query into an intent.\nQuery: where is my new card?\nIntent:"
BRANCHES = [" card arrival\n", " exchange rate\n", " card delivery estimate\n", "", " top up\n",
            " pending cash withdrawal\n"]


# ---------------------------------------------------------------- the prefix tree, pure
@pytest.mark.parametrize("seed", range(40))
def test_the_prefix_tree_is_every_distinct_prefix_once(seed):
    """Against a brute-force restatement: the nodes are exactly the distinct non-empty prefixes, each
    once, a parent before its children; each sequence's path spells it; members are exactly the
    sequences that begin with the node's prefix."""
    rng = np.random.default_rng(seed)
    seqs = [list(rng.integers(0, 3, rng.integers(0, 5))) for _ in range(rng.integers(1, 7))]
    t = prefix_tree(seqs)
    prefixes = {tuple(s[:d + 1]) for s in seqs for d in range(len(s))}
    spelled = []
    for i in range(len(t.tokens)):
        path = next(p for p in t.paths if i in p)
        spelled.append(tuple(t.tokens[j] for j in path[: path.index(i) + 1]))
    assert sorted(spelled) == sorted(prefixes) and len(set(spelled)) == len(spelled)
    for b, s in enumerate(seqs):
        assert [t.tokens[j] for j in t.paths[b]] == [int(x) for x in s]
        assert [t.depth[j] for j in t.paths[b]] == list(range(len(s)))
        assert all(a < c for a, c in itertools.pairwise(t.paths[b]))  # parents come first
    for i, pre in enumerate(spelled):
        assert t.members[i] == [b for b, s in enumerate(seqs) if tuple(int(x) for x in s[: len(pre)]) == pre]


def test_shared_first_tokens_are_one_node():
    t = prefix_tree([[5, 1, 9], [5, 2], [], [5, 1, 7]])
    assert len(t.tokens) == 5 and t.paths[2] == [] and t.members[t.paths[0][0]] == [0, 1, 3]


# ---------------------------------------------------------------- on the bundled model
def _engine(model_path, n_branches: int):
    pytest.importorskip("llama_cpp")
    from miita_edge.runtime.engine import Engine, EngineConfig

    return Engine(model_path, EngineConfig(n_ctx=1024, n_batch=256, n_threads=1, n_branches=n_branches))


@pytest.fixture(scope="module")
def one_seq(model_path):
    eng = _engine(model_path, 0)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def branched(model_path):
    eng = _engine(model_path, 4)
    yield eng
    eng.close()


def _fresh(eng, prompt: list[int], branch: list[int]) -> np.ndarray:
    eng.reset()
    eng.decode(prompt, logits="last")
    rows = eng.decode(branch, logits="all") if branch else np.zeros((0, eng.n_vocab), np.float32)
    eng.reset()
    return rows


def test_the_main_sequence_is_bitwise_a_one_sequence_context(one_seq, branched):
    prompt = one_seq.tokenize(PROMPT)
    a, b = one_seq.query(prompt), branched.query(prompt)
    assert np.array_equal(np.asarray(a.logits), np.asarray(b.logits))
    assert np.array_equal(np.asarray(a.key), np.asarray(b.key))
    one_seq.reset(), branched.reset()
    assert np.array_equal(one_seq.decode(prompt, logits="all"), branched.decode(prompt, logits="all"))


@pytest.mark.parametrize("which", ["one_seq", "branched"])
def test_each_branch_is_its_own_continuation(which, request):
    eng = request.getfixturevalue(which)
    prompt = eng.tokenize(PROMPT)
    branches = [eng.tokenize(t, add_bos=False) for t in BRANCHES]  # six: more than the four slots
    refs = [_fresh(eng, prompt, br) for br in branches]
    state = eng.query(prompt)
    got = decode_branches(eng, branches)
    assert eng.holds(prompt) and eng.n_past == len(prompt)
    assert [g.shape for g in got] == [r.shape for r in refs]
    for g, r in zip(got, refs):
        if which == "one_seq":  # one after another: exactly the fresh decode
            assert np.array_equal(g, r)
        elif len(r):  # together: the same rows up to llama.cpp's rounding of a larger batch
            assert np.abs(g - r).max() < 0.05 * max(1.0, float(np.abs(r).max()))
            assert np.array_equal(g.argmax(axis=1), r.argmax(axis=1))
    # the prompt is still held as the prompt pass left it: the next token is the same
    again = eng.decode(eng.tokenize(" card", add_bos=False), logits="last")
    eng.reset()
    eng.decode(prompt, logits="last")
    assert np.array_equal(again, eng.decode(eng.tokenize(" card", add_bos=False), logits="last"))
    eng.reset()
    del state


def test_branches_leave_no_cells_behind(branched):
    """After many rounds of branches the context still has room for a prompt that fills most of it:
    every branch sequence's cells were removed."""
    prompt = branched.tokenize(PROMPT)
    branches = [branched.tokenize(t, add_bos=False) for t in BRANCHES]
    for _ in range(40):
        branched.query(prompt)
        decode_branches(branched, branches)
    branched.reset()
    long = (prompt * 50)[: 1024 - 8]
    branched.decode(long, logits="last")
    branched.reset()


def test_a_branch_too_long_for_the_context_is_one_clear_error(branched):
    from miita_edge.errors import ContextOverflow

    prompt = branched.tokenize(PROMPT)
    branched.query(prompt)
    with pytest.raises(ContextOverflow, match="exceeds the context"):
        decode_branches(branched, [[int(prompt[-1])] * 1100])
    branched.reset()
