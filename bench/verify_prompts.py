"""Does the model's likelihood of a query after a taught question pick the right fact among the
key's nearest few better than the key does? The first probe behind method/verify.py: the personal
facts' dev half taught once (one memory, version 16), each of its 144 paraphrases keyed, its
``--top`` nearest answers' taught questions read with ``--prefix`` by llama-cpp-python directly.
Prints how often the key's nearest, the model's likeliest among the nearest, and both agreeing are
right; ``--dump`` keeps each query's scores (docs/results/candidates/verify-reach/probe/prompts-*.json).

    python bench/verify_prompts.py [--model GGUF] [--top 5] [--prefix TEXT] [--dump FILE]

Run with the two prompts of docs/method.md §11 ("Question: {c}\nThe same question in other words: "
and "Two ways to ask the same thing:\n1. {c}\n2. "). The facts' dev half is for choosing; this reads
nothing else."""
import sys, tempfile, argparse, math, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import numpy as np
import llama_cpp
from miita_edge import Example, Miita
from miita_edge.evaluation.facts import load_facts, queries
from miita_edge.method.plan import query_key, anchor_best
from miita_edge.method.presets import default_preset
from miita_edge.runtime.engine import Engine, EngineConfig
from miita_edge.runtime.default_model import embedded_model_path

def main() -> int:
    ap = argparse.ArgumentParser(); ap.add_argument("--model"); ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--prefix", default="Question: {c}\nThe same question in other words: ")
    ap.add_argument("--dump")
    args = ap.parse_args()
    path = args.model or str(embedded_model_path())
    fs = load_facts(split="dev")
    llm = llama_cpp.Llama(path, n_ctx=512, n_threads=1, n_threads_batch=1, logits_all=True, verbose=False)
    def logp(prefix, text):
        a = llm.tokenize(prefix.encode(), add_bos=True, special=False)
        b = llm.tokenize((prefix + text).encode(), add_bos=True, special=False)
        n = len(a)
        while n > 0 and b[:n] != a[:n]: n -= 1
        llm.reset(); llm.eval(b)
        lp = 0.0
        for i in range(n, len(b)):
            row = np.asarray(llm.scores[i - 1], np.float64)
            m = row.max(); lse = m + math.log(np.exp(row - m).sum())
            lp += row[b[i]] - lse
        return lp
    engine = Engine(args.model, EngineConfig(n_threads=1))
    facts = fs.facts
    taught = [f.teach[0] for f in facts]
    res = []
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d, Miita(memory=Path(d) / "m", preset=default_preset(), engine=engine, template="auto") as m:
        m.ingest([Example(f.teach[0], f.answer) for f in facts], budget="none")
        index = m.pipeline.index(m.bank, None)
        labels = [m.keyed_engine().detokenize(t).strip() for t in m.bank.answer_tokens()]
        fact_of_label = {f.answer: i for i, f in enumerate(facts)}
        for fi, f in enumerate(facts):
            for q in f.ask:
                state = m.query_state(q)
                best = anchor_best(index, query_key(m.preset, m.bank, index, state), np.arange(m.bank.n_prototypes))
                order = [fact_of_label[labels[j]] for j in np.argsort(-best)[:args.top]]
                base = logp("Question: ", q)
                scores = [logp(args.prefix.format(c=taught[c]), q) for c in order]
                res.append((fi, order, scores, base, sorted(best)[-1] - sorted(best)[-2]))
    print(f"{len(res)} paraphrases, {time.time()-t0:.0f} s, prefix {args.prefix!r}")
    key_right = sum(o[0] == fi for fi, o, *_ in res)
    pmi_right = sum(o[int(np.argmax(s))] == fi for fi, o, s, *_ in res)
    in_top = sum(fi in o for fi, o, *_ in res)
    agree = [(fi, o) for fi, o, s, *_ in res if int(np.argmax(s)) == 0]
    print(f"key nearest right {key_right}, right in top {args.top} {in_top}, PMI-rerank right {pmi_right}")
    print(f"agree (key nearest == PMI best): {len(agree)}, of which right {sum(o[0]==fi for fi,o in agree)}, wrong {sum(o[0]!=fi for fi,o in agree)}")
    # margin of PMI: best minus second
    for thr in (0, 1, 2, 3, 5):
        kept = [(fi, o) for fi, o, s, *_ in res if int(np.argmax(s)) == 0 and (len(s) < 2 or s[0] - max(s[1:]) >= thr)]
        print(f"  agree and PMI lead >= {thr}: right {sum(o[0]==fi for fi,o in kept)}, wrong {sum(o[0]!=fi for fi,o in kept)}")
    # absolute PMI of key nearest
    for thr in (0, 2, 4, 6, 8):
        kept = [(fi, o) for fi, o, s, b, g in res if s[0] - b >= thr]
        print(f"  PMI(nearest) >= {thr}: right {sum(o[0]==fi for fi,o in kept)}, wrong {sum(o[0]!=fi for fi,o in kept)}")
    engine.close()
    import json
    if args.dump: json.dump([dict(fact=fi, order=[int(x) for x in o], scores=s, base=b, gap=float(g)) for fi,o,s,b,g in res], open(args.dump,"w"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
