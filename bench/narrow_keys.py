"""What a narrow key can tell: one centroid per answer at K stored bits, under other key frames and
other nearest-question bars (docs/tried.md).

Why: at Banking77's 1% budget every answer keeps one centroid of few bits (40 before the token
dictionary, 80 after), and the vote and the relevance gate read only those bits. Before spending
bytes differently, this asks whether the bits themselves could carry more (a projection derived
from the model, not stored) and whether the gate's nearest-question margin is what declines
in-domain queries. A numpy re-derivation of the default's keys (calibration centring, per-layer
blocks, sign bits), no memory and no generation:

    python bench/narrow_keys.py extract [--model GGUF] --benchmark banking77 --data ../shared/data/banking77 --out keys.npz
    python bench/narrow_keys.py frames keys.npz
    python bench/narrow_keys.py gate keys.npz
    python bench/narrow_keys.py sizes keys.npz
    python bench/narrow_keys.py balanced keys.npz
    python bench/narrow_keys.py balanced-gate keys.npz

Rows: the stream's training rows (dev rows left out) make the centroids, the dev rows are asked.
``frames``: the vote's accuracy (float query · stored bits) at K bits for the shipped order and for
alternatives. ``gate``: the share of dev rows the gate keeps and the vote gets right, and the share of
``key_whitening.GROUPS``' everyday requests (no benchmark's intents) it lets through, per margin.
``balanced``: which K coordinates a narrowed key keeps: the shipped order's first K, or the K of most
worth to this memory's answers (``MemoryBank._balanced_keep``: p(1 - p), p the share of answers with
a positive bit, times the coordinate's size over a set of the model's prompts, or alone).
``balanced-gate``: the stream taught in seven equal parts, keys narrowed after each (by the shipped
order or by worth, s over the paraphrase groups) towards K bits; then the vote and the shipped gate
(null at 1.64 sd over the general questions, nearest-question bar at 1/sqrt(K)) at K, the gate also
with a shared row (the answers' majority sign at each dropped coordinate among the first N, beside
each answer's own bits: ``narrow_rule = "balanced-shared"``).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WIDTHS = (32, 40, 64, 80, 104, 128, 256, 512, 992, 1152, 1280, 1408, 1536)


def extract(args) -> None:
    sys.path.insert(0, str(ROOT / "python"))
    from miita_edge import Miita
    from miita_edge.evaluation.benchmarks import get_benchmark, load_benchmark
    from miita_edge.method import key_whitening as kw
    from miita_edge.method.calibration import CALIBRATION_INPUTS, raw_key
    from miita_edge.method.relevance import GENERIC_QUESTIONS

    spec = get_benchmark(args.benchmark)
    _, stages = load_benchmark(spec, args.data, split="dev")
    train = [e for s in stages for e in s.train]
    dev = [it.example for s in stages for it in s.test]
    with tempfile.TemporaryDirectory() as tmp, Miita(args.model, Path(tmp) / "mem", template=spec.template) as m:
        eng = m.keyed_engine()

        def keys(xs):
            return np.stack([raw_key(eng, m.template, x, m.preset.skip_bos) for x in xs]).astype(np.float32)

        out = dict(train=keys([e.input for e in train]), train_y=np.array([e.output for e in train]),
                   dev=keys([e.input for e in dev]), dev_y=np.array([e.output for e in dev]),
                   para=kw.paraphrase_keys(eng, m.template, m.preset.skip_bos, m.fingerprint()),
                   para_g=kw.group_ids(), generic=keys(GENERIC_QUESTIONS), calib=keys(CALIBRATION_INPUTS),
                   mean=np.asarray(m.bank.key_mean, np.float32), parts=len(m.key_layers),
                   order=np.asarray(m.bank.key_order))
    np.savez(args.out, **out)


def load(path):
    sys.path.insert(0, str(ROOT / "python"))
    from miita_edge.method import key_whitening as kw
    d = np.load(path, allow_pickle=False)
    d = {k: d[k] for k in d.files}
    parts = int(d["parts"])

    def prep(raw):
        return kw.prepared(raw, d["mean"], parts)
    return d, prep, kw


def frames(d, prep, kw) -> dict:
    """Each frame: a function from prepared keys (N, n) to coordinates in the order bits are kept."""
    z = prep(d["train"])
    n = z.shape[1]
    gen = prep(np.concatenate([d["para"], d["generic"], d["calib"]]))
    zp = prep(d["para"])
    out = {"shipped order": lambda x: x[:, d["order"]]}
    _, _, vt = np.linalg.svd(gen - gen.mean(0), full_matrices=False)
    out["general prompts' principal axes"] = lambda x, v=vt.T: x @ v
    M = kw.whitening_matrix(kw.within_scatter(zp, d["para_g"]), kw.SHRINK)
    gm = np.stack([(zp @ M)[d["para_g"] == i].mean(0) for i in np.unique(d["para_g"])])
    _, _, vt3 = np.linalg.svd(gm - gm.mean(0), full_matrices=False)
    out["whitened group axes"] = lambda x, M=M, v=vt3.T: (x @ M) @ v
    xc = prep(d["calib"])
    spread = ((xc - xc.mean(0)) ** 2).mean(0)
    out["one order over both blocks"] = lambda x, o=np.argsort(-spread, kind="stable"): x[:, o]
    # the shipped order's rule (per block, by spread, highest first) over more prompts: the 16
    # calibration prompts and the general ones (paraphrase groups, generic questions), all model-derived
    parts = int(d["parts"])
    H = n // parts
    sp = ((gen - gen.mean(0)) ** 2).mean(0).reshape(parts, H)
    wide = np.concatenate([b * H + np.argsort(-sp[b], kind="stable") for b in range(parts)])
    out["spread over general prompts"] = lambda x, o=wide: x[:, o]
    # a complete rotation (every width, not only the general prompts' rank): eigenvectors of their
    # covariance, highest variance first; jointly over both blocks, or per block, block by block
    def eig_order(x):
        w, v = np.linalg.eigh(np.cov(x, rowvar=False))
        return v[:, np.argsort(-w, kind="stable")]
    out["principal axes, completed"] = lambda x, v=eig_order(gen): x @ v
    # the same without the gate's generic questions (the paraphrase groups and calibration inputs,
    # both cached per model): what a memory can derive at open without 40 more key passes
    pc = prep(np.concatenate([d["para"], d["calib"]]))
    out["principal axes of paraphrases + calibration, completed"] = lambda x, v=eig_order(pc): x @ v

    from miita_edge.method.key_axes import principal_axes  # the candidate's frame (Preset.key_axes)
    out["axes of paraphrases + calibration, then shipped coordinates"] = \
        lambda x, v=principal_axes(pc, d["order"]).T: x @ v
    R2 = np.zeros((n, n))
    for b in range(parts):
        R2[b * H:(b + 1) * H, b * H:(b + 1) * H] = eig_order(gen[:, b * H:(b + 1) * H])
    out["principal axes per block, completed"] = lambda x, v=R2: x @ v
    if parts == 2:  # the other layer's block first
        ship = d["order"]
        out["shipped order, second block first"] = lambda x, o=np.r_[ship[H:], ship[:H]]: x[:, o]
        out["general spread, second block first"] = lambda x, o=np.r_[wide[H:], wide[:H]]: x[:, o]
    # the leading axes' projections stored before every coordinate (n + P bits unnarrowed): narrow
    # keys are the axes, wide keys mostly the coordinates
    for P in (128, 256):
        out[f"{P} general axes, then all coordinates (overcomplete)"] = \
            lambda x, v=principal_axes(pc, d["order"])[:P].T, o=d["order"]: np.concatenate([x @ v, x[:, o]], axis=1)
    R = np.random.default_rng(0).standard_normal((n, 512))
    out["random projection"] = lambda x, R=R: x @ R
    return out


def centroid_bits(Z: np.ndarray, y: np.ndarray, labels: list) -> np.ndarray:
    """±1 sign of each answer's sum of unit keys (what one folded centroid per answer stores)."""
    idx = {lab: i for i, lab in enumerate(labels)}
    C = np.zeros((len(labels), Z.shape[1]))
    for i, lab in enumerate(y):
        C[idx[lab]] += Z[i] / np.linalg.norm(Z[i])
    return np.where(C >= 0, 1.0, -1.0)


def cmd_frames(path) -> None:
    d, prep, kw = load(path)
    z, q = prep(d["train"]), prep(d["dev"])
    labels = sorted(set(d["train_y"].tolist()))
    gold = np.array([labels.index(y) if y in labels else -1 for y in d["dev_y"].tolist()])
    print("| frame | " + " | ".join(f"{k} bits" for k in WIDTHS) + " |")
    print("|---|" + "---|" * len(WIDTHS))
    for name, f in frames(d, prep, kw).items():
        Z, Q = f(z), f(q)
        cells = []
        for K in WIDTHS:
            if K > Z.shape[1]:
                cells.append("–")
                continue
            B = centroid_bits(Z[:, :K], d["train_y"].tolist(), labels)
            cells.append(f"{100 * np.mean((Q[:, :K] @ B.T).argmax(1) == gold):.1f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


def cmd_gate(path) -> None:
    """The gate's per-answer null (mean + 1.64 sd over the general questions) and its nearest-question
    bar with three margins, on sign-bit cosines, as ``relevance.gate`` compares them."""
    from miita_edge.method.relevance import NEAREST_Z
    d, prep, _ = load(path)
    o = d["order"]
    Z, Q, G, P = (prep(d[k])[:, o] for k in ("train", "dev", "generic", "para"))
    labels = sorted(set(d["train_y"].tolist()))
    gold = np.array([labels.index(y) if y in labels else -1 for y in d["dev_y"].tolist()])
    print("| bits | margin | dev rows kept and right % | everyday requests let through % |")
    print("|---|---|---|---|")
    for K in (32, 48, 80, 128, 304):
        B = centroid_bits(Z[:, :K], d["train_y"].tolist(), labels)

        def sg(X):
            return np.where(X[:, :K] >= 0, 1.0, -1.0)
        gb = sg(G) @ B.T / K
        null = gb.mean(0) + NEAREST_Z * gb.std(0)
        for name, margin in (("1/√K (shipped)", 1 / np.sqrt(K)), ("2/K", 2.0 / K), ("none", 0.0)):
            kept = []
            for X in (Q, P):
                vote = (X[:, :K] @ B.T).argmax(1)
                best = (sg(X) @ B.T / K)[np.arange(len(X)), vote]
                floor = (sg(X) @ sg(G).T / K).max(1) + margin
                kept.append((best > np.maximum(null[vote], floor), vote))
            (kq, vq), (kp, _) = kept
            print(f"| {K} | {name} | {100 * np.mean(kq & (vq == gold)):.1f} | {100 * kp.mean():.1f} |")


def _vote_right(Z, y, Q, gold, labels, K) -> float:
    """The one-centroid-per-answer vote's accuracy % at the first K kept coordinates."""
    B = centroid_bits(Z[:, :K], y, labels)
    return 100 * float(np.mean((Q[:, :K] @ B.T).argmax(1) == gold))


def _gate_shares(Z, y, Q, gold, P, G, labels, K) -> tuple[float, float]:
    """The shipped gate's (null at 1.64 sd, nearest-question bar at 1/sqrt(K)) share of dev rows kept
    and right, and share of everyday requests ``P`` let through, with generic questions ``G``."""
    from miita_edge.method.relevance import NEAREST_Z
    B = centroid_bits(Z[:, :K], y, labels)

    def sg(X):
        return np.where(X[:, :K] >= 0, 1.0, -1.0)
    gb = sg(G) @ B.T / K
    null = gb.mean(0) + NEAREST_Z * gb.std(0)
    out = []
    for X in (Q, P):
        vote = (X[:, :K] @ B.T).argmax(1)
        best = (sg(X) @ B.T / K)[np.arange(len(X)), vote]
        floor = (sg(X) @ sg(G).T / K).max(1) + 1 / np.sqrt(K)
        out.append((best > np.maximum(null[vote], floor), vote))
    (kq, vq), (kp, _) = out
    return 100 * float(np.mean(kq & (vq == gold))), 100 * float(kp.mean())


def cmd_sizes(path, halves: int = 20, seed: int = 0) -> None:
    """Are the hand-written sets large enough? Each set decides one thing (the calibration inputs: the
    centring and the coordinate order; the generic questions: the gate's bars; the paraphrase groups:
    the whitening of a memory of replies); that thing is measured with the whole set and with
    ``halves`` random halves of it. A set is large enough where its halves already agree with it
    within a fraction of the spread that a dev-row interval resolves (one query of 308 is 0.3)."""
    from miita_edge.method.calibration import key_order
    d, _, kw = load(path)
    parts = int(d["parts"])
    rng = np.random.default_rng(seed)
    labels = sorted(set(d["train_y"].tolist()))
    y = d["train_y"].tolist()
    gold = np.array([labels.index(v) if v in labels else -1 for v in d["dev_y"].tolist()])
    n = d["train"].shape[1]
    widths = (104, n)
    shipped_order = key_order(d["calib"], parts)
    print(f"shipped order re-derived from the 16 calibration keys: "
          f"{'equal' if np.array_equal(shipped_order, d['order']) else 'DIFFERENT'}")

    def frame(calib):
        mean, order = calib.mean(0), key_order(calib, parts)
        return (lambda raw: kw.prepared(raw, mean, parts)[:, order])

    def summary(full, subs):
        subs = np.asarray(subs)
        return (f"{full:.1f} | {subs.mean():.1f} | {subs.min():.1f}–{subs.max():.1f} | "
                f"{np.abs(subs - full).mean():.1f}")

    print("| set (size) | measure | whole set | halves: mean | halves: range | mean distance |")
    print("|---|---|---|---|---|---|")
    c = d["calib"]
    picks = [rng.choice(len(c), len(c) // 2, replace=False) for _ in range(halves)]
    for K in widths:
        f = frame(c)
        full = _vote_right(f(d["train"]), y, f(d["dev"]), gold, labels, K)
        subs = []
        for s in picks:
            g = frame(c[s])
            subs.append(_vote_right(g(d["train"]), y, g(d["dev"]), gold, labels, K))
        print(f"| calibration inputs ({len(c)}) | vote right %, {K} bits | {summary(full, subs)} |")
    f = frame(c)
    Z, Q, P, G = (f(d[k]) for k in ("train", "dev", "para", "generic"))
    picks = [rng.choice(len(G), len(G) // 2, replace=False) for _ in range(halves)]
    for K in widths:
        full = _gate_shares(Z, y, Q, gold, P, G, labels, K)
        subs = [_gate_shares(Z, y, Q, gold, P, G[s], labels, K) for s in picks]
        for i, what in enumerate(("dev rows kept and right %", "everyday requests let through %")):
            print(f"| generic questions ({len(G)}) | {what}, {K} bits | "
                  f"{summary(full[i], [v[i] for v in subs])} |")
    zp = kw.prepared(d["para"], c.mean(0), parts)
    groups = d["para_g"]
    ug = np.unique(groups)
    zt, zq = kw.prepared(d["train"], c.mean(0), parts), kw.prepared(d["dev"], c.mean(0), parts)

    def whitened_vote(sel):
        keep = np.isin(groups, sel)
        M = kw.whitening_matrix(kw.within_scatter(zp[keep], groups[keep]), kw.SHRINK)
        return _vote_right(zt @ M, y, zq @ M, gold, labels, n)
    full = whitened_vote(ug)
    subs = [whitened_vote(rng.choice(ug, len(ug) // 2, replace=False)) for _ in range(halves)]
    print(f"| paraphrase groups ({len(ug)}) | whitened vote right %, {n} bits | {summary(full, subs)} |")


def cmd_balanced(path) -> None:
    """The vote's accuracy at K bits, one centroid per answer, the kept coordinates chosen by their worth
    to the memory's answers against the shipped order's first K; the size s_i of a coordinate is its root
    mean square over one of the model's prompt sets (``calibration.coordinate_rms``' rule)."""
    d, prep, _ = load(path)
    o = d["order"]
    Z, Q = prep(d["train"])[:, o], prep(d["dev"])[:, o]
    labels = sorted(set(d["train_y"].tolist()))
    gold = np.array([labels.index(y) if y in labels else -1 for y in d["dev_y"].tolist()])
    B = centroid_bits(Z, d["train_y"].tolist(), labels)
    p = (B > 0).mean(0)
    pos = np.arange(B.shape[1])
    rules = {"shipped order": -pos.astype(float), "p(1 - p) alone": p * (1 - p)}
    for name, key in (("calibration inputs", "calib"), ("general questions", "generic"), ("paraphrase groups", "para")):
        rules[f"s x p(1 - p), s over the {name}"] = np.sqrt((prep(d[key])[:, o] ** 2).mean(0)) * p * (1 - p)
    widths = (64, 96, 104, 112, 128, 160, 256, 512)
    print("| kept coordinates | " + " | ".join(str(K) for K in widths) + " |")
    print("|---|" + "---|" * len(widths))
    for name, worth in rules.items():
        sel = np.lexsort((pos, -worth))
        row = [100 * float(np.mean((Q[:, sel[:K]] @ B[:, sel[:K]].T).argmax(1) == gold)) for K in widths]
        print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in row) + " |")


def cmd_balanced_gate(path) -> None:
    from miita_edge.method.relevance import NEAREST_Z
    d, prep, _ = load(path)
    o = d["order"]
    Z, Q, G, P = (prep(d[k])[:, o] for k in ("train", "dev", "generic", "para"))
    rms = np.sqrt((P ** 2).mean(0))
    ty = d["train_y"].tolist()
    labels = list(dict.fromkeys(ty))  # in stream order
    yi = np.array([labels.index(y) for y in ty])
    gold = np.array([labels.index(y) if y in labels else -1 for y in d["dev_y"].tolist()])
    n, N = Z.shape[1], len(ty)
    Zn = Z / np.linalg.norm(Z, axis=1, keepdims=True)

    def cents(upto):
        C = np.zeros((yi[:upto].max() + 1, n))
        np.add.at(C, yi[:upto], Zn[:upto])
        return np.where(C >= 0, 1.0, -1.0)

    def narrow(rule, final, parts=7):
        cols = np.arange(n)
        for i, b in enumerate(np.linspace(0, N, parts + 1).astype(int)[1:]):
            K = max(final, n - (n - final) * (i + 1) // parts) // 8 * 8
            B = cents(b)
            while len(cols) > K:
                if rule == "shipped order":
                    cols = cols[:-8]
                    continue
                p = (B[:, cols] > 0).mean(0)
                drop = np.lexsort((-np.arange(len(cols)), p * (1 - p) * rms[cols]))[:8]
                cols = np.delete(cols, drop)
        return cols

    def gate(cols, span):
        B = cents(N)
        dropped = np.setdiff1d(np.arange(min(span, n)), cols)
        ext = np.concatenate([cols, dropped])
        Bx = B.copy()
        Bx[:, dropped] = np.where((B[:, dropped] > 0).mean(0) >= 0.5, 1.0, -1.0)
        K = len(ext)

        def sg(X):
            return np.where(X[:, ext] >= 0, 1.0, -1.0)
        gb = sg(G) @ Bx[:, ext].T / K
        null = gb.mean(0) + NEAREST_Z * gb.std(0)
        out = []
        for X in (Q, P):
            vote = (X[:, cols] @ B[:, cols].T).argmax(1)
            best = (sg(X) @ Bx[:, ext].T / K)[np.arange(len(X)), vote]
            floor = (sg(X) @ sg(G).T / K).max(1) + 1 / np.sqrt(K)
            out.append((best > np.maximum(null[vote], floor), vote))
        (kq, vq), (kp, _) = out
        return [100 * float(v) for v in (np.mean(vq == gold), np.mean(kq & (vq == gold)), 1 - kq.mean(), kp.mean())]

    print("| bits kept | narrowing | shared row over the first | vote % | gate: kept and right % | declined % "
          "| everyday requests let through % |")
    print("|---|---|---|---|---|---|---|")
    for K in (96, 112):
        for rule in ("shipped order", "by worth"):
            cols = narrow(rule, K)
            for span in ((0,) if rule == "shipped order" else (0, 128, 256, 512, n)):
                v = gate(cols, span)
                print(f"| {K} | {rule} | {span or 'none'} | " + " | ".join(f"{x:.1f}" for x in v) + " |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("extract")
    e.add_argument("--model")
    e.add_argument("--benchmark", default="banking77")
    e.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "banking77")
    e.add_argument("--out", type=Path, required=True)
    for name in ("frames", "gate", "sizes", "balanced", "balanced-gate"):
        sub.add_parser(name).add_argument("keys", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "extract":
        extract(args)
    elif args.cmd == "frames":
        cmd_frames(args.keys)
    elif args.cmd == "sizes":
        cmd_sizes(args.keys)
    elif args.cmd == "balanced":
        cmd_balanced(args.keys)
    elif args.cmd == "balanced-gate":
        cmd_balanced_gate(args.keys)
    else:
        cmd_gate(args.keys)
    return 0


if __name__ == "__main__":
    sys.exit(main())
