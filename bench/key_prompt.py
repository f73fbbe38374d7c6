"""Which prompt should a key be pooled from? A probe without generation, on dev rows only.

Teaching once fails where a paraphrase's nearest taught question is another fact (docs/evaluation.md,
"Personal facts"): the key, not the gate, is the limit. A causal model's state at the end of the
answer's prompt holds what comes next as much as what was asked; PromptEOL (Jiang et al. 2023,
"Scaling Sentence Embeddings with Large Language Models") asks the model for the input's meaning in
one word and reads the state where that word is due. This compares, in sign-bit keys centred on the
calibration prompts of the same key prompt (one bit per coordinate, no budget):

- ``memory``: the memory's own template (today's key);
- ``meaning``: ``templates.KEY_PROMPTS["meaning"]`` around the input as typed;
- ``meaning+canonical``: the same around ``templates.canonical_text`` of the input (what
  ``Preset.key_prompt = "meaning"`` renders).

Two measures, both with the key layers the memory's template chose (the candidate measures them
again through its own prompt):

1. the personal facts' dev half, each fact's first teaching phrasing as the taught key: how often an
   unseen question's nearest taught key is its fact (forms of the taught phrasing, paraphrases,
   forms of the paraphrases; ``evaluation.facts.variants``), and the median nearest cosine of the
   unrelated questions;
2. Banking77's dev rows (308) against ``--per`` training rows of each intent (the first of each
   stage's learnable rows): the nearest row's intent, the 8 nearest rows' majority, and the nearest
   intent centroid (the sign of the sum of its rows).

    python bench/key_prompt.py --data ../shared/data [--model GGUF] [--per 6] [--threads 1]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter, defaultdict
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def cosines(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Cosine of ±1 sign keys: 1 − 2·(share of differing signs)."""
    return 1.0 - 2.0 * (X[:, None, :] != Y[None]).mean(axis=2)


def sign_keys(eng, tpl, texts, skip_bos: bool, parts: int, mean: np.ndarray) -> np.ndarray:
    """±1 keys: raw key − mean, each layer's block at unit norm, the sign of each coordinate."""
    from miita_edge.method.calibration import raw_key

    out = []
    for x in texts:
        k = (raw_key(eng, tpl, x, skip_bos) - mean).reshape(parts, -1)
        k = k / np.maximum(np.linalg.norm(k, axis=1, keepdims=True), 1e-12)
        out.append(np.where(k.reshape(-1) >= 0, 1, -1).astype(np.int8))
    return np.stack(out)


@contextmanager
def keyers(eng, first: tuple[str, str], title: str, header: str, template: str | None = None):
    """A one-example memory of the default preset (for its template and key layers), the table's
    title and header printed; yields [(key prompt name, keys_of(texts))], each keyer centred on
    the calibration prompts rendered by its own key prompt."""
    from miita_edge import Example, Miita
    from miita_edge.method.calibration import CALIBRATION_INPUTS, raw_key
    from miita_edge.method.presets import default_preset

    with tempfile.TemporaryDirectory() as tmp, Miita(memory=Path(tmp) / "mem", engine=eng, preset=default_preset(),
                                                     template=template) as m:
        m.ingest([Example(*first)], budget="none", progress=False)
        e, skip, parts = m.keyed_engine(), m.preset.skip_bos, m.bank.key_parts
        print(f"{title}; key layers {list(e.key_layers)} ({', '.join(e.key_pooling)}), template {m.template.name}")
        print(header)
        print("|---" + "|---:" * (header.count("|") - 2) + "|")
        out = []
        for name, tpl in variants_of(m.template):
            mean = np.mean([raw_key(e, tpl, x, skip) for x in CALIBRATION_INPUTS], axis=0)
            out.append((name, lambda texts, tpl=tpl, mean=mean: sign_keys(e, tpl, texts, skip, parts, mean)))
        yield out


def variants_of(memory_tpl):
    """(name, template) of each key prompt compared, for a memory of ``memory_tpl``."""
    from miita_edge.method.templates import KEY_PROMPTS, Template, key_template

    plain = Template(f"{memory_tpl.name}+meaning-as-typed", KEY_PROMPTS["meaning"], memory_tpl.target,
                     max_input_words=memory_tpl.max_input_words, special=memory_tpl.special)
    return [("memory", memory_tpl), ("meaning", plain), ("meaning+canonical", key_template("meaning", memory_tpl))]


def facts_probe(eng, args) -> None:
    from miita_edge.evaluation.facts import load_facts, variants

    fs = load_facts(split="dev")
    with keyers(eng, (fs.facts[0].teach[0], fs.facts[0].answer),
                f"## personal facts, dev half ({len(fs.facts)} facts, {len(fs.unrelated)} unrelated questions)",
                "| key prompt | forms | paraphrases | forms of paraphrases | all unseen | unrelated: nearest cosine "
                "(median) |") as ks:
        for name, keys_of in ks:
            taught = keys_of([f.teach[0] for f in fs.facts])
            cells, hits, n = [], 0, 0
            for kind in ("forms", "paraphrases", "paraphrase forms"):
                asked, fact = [], []
                for i, f in enumerate(fs.facts):
                    qs = (variants(f.teach[0]) if kind == "forms" else list(f.ask) if kind == "paraphrases"
                          else [v for p in f.ask for v in variants(p)])
                    asked += qs
                    fact += [i] * len(qs)
                right = cosines(keys_of(asked), taught).argmax(1) == np.asarray(fact)
                cells.append(f"{right.mean():.1%} ({len(right)})")
                hits, n = hits + int(right.sum()), n + len(right)
            un = cosines(keys_of(fs.unrelated), taught).max(1)
            print(f"| {name} | {' | '.join(cells)} | {hits / n:.1%} | {np.median(un):.3f} |", flush=True)


def banking77_probe(eng, args) -> None:
    from miita_edge.evaluation.benchmarks import get_benchmark, load_benchmark

    spec = get_benchmark("banking77")
    _, stages = load_benchmark(spec, Path(args.data) / "banking77", split="dev")
    rows = defaultdict(list)
    for st in stages:
        for ex in st.train:
            if len(rows[ex.output]) < args.per:
                rows[ex.output].append(ex.input)
    labels = sorted(rows)
    ax = [(x, y) for y in labels for x in rows[y]]
    dev = [(it.example.input, it.example.output) for st in stages for it in st.test]
    with keyers(eng, ax[0], f"\n## Banking77 dev rows ({len(dev)}) against {len(ax)} training rows ({args.per} per "
                f"intent)", "| key prompt | nearest row | 8 nearest rows' majority | nearest centroid |",
                template=spec.template) as ks:
        for name, keys_of in ks:
            A = keys_of([x for x, _ in ax]).astype(np.float32)
            D = keys_of([x for x, _ in dev]).astype(np.float32)
            ay, dy = np.array([y for _, y in ax]), np.array([y for _, y in dev])
            S = D @ A.T
            nn1 = (ay[S.argmax(1)] == dy).mean()
            top = np.argsort(-S, axis=1, kind="stable")[:, :8]
            knn = np.mean([Counter(ay[r]).most_common(1)[0][0] == y for r, y in zip(top, dy)])
            C = np.stack([np.sign(A[ay == y].sum(0) + 1e-9) for y in labels])
            cen = (np.array(labels)[(D @ C.T).argmax(1)] == dy).mean()
            print(f"| {name} | {nn1:.1%} | {knn:.1%} | {cen:.1%} |", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--model", default=None, help="GGUF path (default: the embedded Gemma-3-270M)")
    ap.add_argument("--per", type=int, default=6, help="Banking77 training rows per intent")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    from miita_edge.runtime.engine import Engine, EngineConfig

    eng = Engine(args.model, EngineConfig(n_threads=args.threads))
    try:
        facts_probe(eng, args)
        banking77_probe(eng, args)
    finally:
        eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
