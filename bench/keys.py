"""How keys should be pooled, centred and stored: label-vote accuracy of variants.

Extracts the key of every train and test prompt of one stage once, then scores
the top-k anchor vote (no language model) for each variant. This isolates the
key design from generation. Used for docs/method.md.

    python bench/keys.py --data ../shared/data/banking77
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from presets import load_stage  # noqa: E402


def vote_acc(Q, A, labels_a, golds, k=8, T=0.05):
    from miita_edge.method.steering import knn_prototypes, vote

    uniq = sorted(set(labels_a))
    owner = np.array([uniq.index(l) for l in labels_a])
    hits = 0
    for q, g in zip(Q, golds):
        ids, w, _ = knn_prototypes(q, A, owner, k, T)
        hits += vote(ids, w, uniq) == g
    return 100.0 * hits / len(golds)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", type=Path, default=Path("../shared/data/banking77"))
    ap.add_argument("--template", default="banking77")
    ap.add_argument("--stage", default=None)
    args = ap.parse_args(argv)

    from miita_edge.memory import codecs
    from miita_edge.runtime.engine import Engine
    from miita_edge.miita import CALIBRATION_INPUTS
    from miita_edge.method.templates import get_template

    stage, train, test = load_stage(args.data, args.stage, None)
    eng = Engine()
    tpl = get_template(args.template)

    def keys(texts, skip_bos):
        return np.stack([eng.query(eng.tokenize(tpl.render_prompt(t)), skip_bos_in_key=skip_bos).key for t in texts])

    print(f"# {args.data.name} {stage}: {len(train)} anchors, {len(test)} queries; top-8 anchor vote, T=0.05")
    golds = [e.output for e in test]
    labs = [e.output for e in train]
    for skip_bos in (False, True):
        Ktr, Kte = keys([e.input for e in train], skip_bos), keys([e.input for e in test], skip_bos)
        cal = keys(CALIBRATION_INPUTS, skip_bos).mean(0)
        means = {"none": np.zeros(eng.n_embd, np.float32), "train mean f16": Ktr.mean(0).astype(np.float16).astype(np.float32),
                 "train mean int8": codecs.roundtrip(Ktr.mean(0)[None], "int8")[0],
                 "calibration mean": cal}
        for mname, mu in means.items():
            for prec in ("float32", "bit"):
                A = codecs.roundtrip(Ktr - mu, prec)
                acc = vote_acc(Kte - mu, A, labs, golds)
                # one centroid anchor per label (sum of centred keys, then stored)
                uniq = sorted(set(labs))
                C = np.stack([(Ktr - mu)[[l == u for l in labs]].mean(0) for u in uniq])
                accc = vote_acc(Kte - mu, codecs.roundtrip(C, prec), uniq, golds, k=1)
                print(f"bos={'dropped' if skip_bos else 'kept':7s} centre={mname:16s} keys={prec:7s}: "
                      f"all anchors {acc:5.1f}%   one centroid/label {accc:5.1f}%", flush=True)
    eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
