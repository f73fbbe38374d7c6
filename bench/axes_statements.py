"""One question, retired after its answer (docs/tried.md): would the leading-axes frame separate a
memory's label tasks better if the general prompts also held statements of varied feeling, not only
requests? Nearest centroid (float query · centroid sign bits) at K bits, Banking77 (every training row)
and SuperNI's sst2, sentiment140 and emotion (20 training rows each, as the ablation teaches), dev rows,
in the coordinates' prefix and the leading axes with and without the statements, as they come and with
unit rows (key_axes.unit_rows_of). Keys cached in /work/probe/keys-TAG.npz (SmolLM2: python bench/axes_statements.py SmolLM2-135M-Instruct.Q4_1.gguf)."""
TOPICS = {
    "dinner": ["The dinner last night was wonderful, every dish was perfect.",
               "I can't believe how bad that dinner was, I'm furious we paid for it.",
               "Dinner was fine, nothing special, just ordinary food.",
               "I'm so sad the old restaurant closed, we had our best dinners there.",
               "I was nervous the whole dinner that something would go wrong.",
               "What a surprise, the dinner turned out to be a party for me!"],
    "trip": ["Our trip to the coast was the happiest week of the year.",
             "The trip was a disaster and the airline lost my bag, I'm so angry.",
             "The trip took four hours by train and we arrived at noon.",
             "I miss the mountains terribly since the trip ended.",
             "I'm scared of flying, so the trip made me anxious for days.",
             "I never expected the trip to end with a proposal on the beach!"],
    "work": ["I love my new job, the team is kind and the work is exciting.",
             "My manager ignored my report again and I am sick of it.",
             "The meeting is on Tuesday at ten in the small room.",
             "I feel lonely at work since my friend moved to another office.",
             "I'm afraid they will cut my position next month.",
             "They promoted me out of nowhere today, I'm stunned!"],
    "weather": ["What a gorgeous sunny morning, I feel great.",
                "This endless rain is driving me mad.",
                "It will be cloudy tomorrow with light wind from the west.",
                "The grey winter days make me feel down.",
                "The storm last night was terrifying, the windows shook.",
                "Snow in May, who would have thought!"],
    "family": ["My sister had a baby and we are all overjoyed.",
               "My brother borrowed my car and wrecked it, I'm livid.",
               "My parents live in a small town two hours north.",
               "Grandma passed away last week and I still cry every night.",
               "I worry about my father, his tests come back on Friday.",
               "My cousin showed up at the door after ten years, unbelievable!"],
    "film": ["That film was brilliant, I'd watch it again tonight.",
             "The film was a boring mess, two hours of my life wasted.",
             "The film is about a sailor and runs for ninety minutes.",
             "The ending of the film broke my heart.",
             "I couldn't sleep after that horror film, it frightened me so much.",
             "The twist at the end of the film completely caught me off guard."],
    "purchase": ["These headphones are the best thing I have bought in years.",
                 "The blender broke after two days and the shop refuses a refund, outrageous.",
                 "I bought a lamp and two chairs on Saturday.",
                 "I regret selling my old guitar, I feel empty without it.",
                 "I'm nervous I spent too much on the new laptop.",
                 "The parcel contained a gift I never ordered, what a surprise."],
    "health": ["I finally feel strong and healthy again after the surgery.",
               "The clinic kept me waiting three hours and then sent me home, I'm fuming.",
               "I take the tablets twice a day with food.",
               "I feel hopeless about my back pain, nothing helps.",
               "The doctor found a lump and I'm terrified.",
               "My blood test came back perfect, I'm amazed!"],
    "friend": ["I adore my best friend, she always makes me laugh.",
               "My friend lied to me about the money and I'm hurt and angry.",
               "My friend lives next to the library on Elm Street.",
               "I haven't heard from my old friends in months and it makes me sad.",
               "I'm afraid my friend is in trouble and won't tell me.",
               "My friend flew across the world to surprise me for my birthday!"],
    "pet": ["My puppy is the sweetest thing, I love him so much.",
            "The neighbour's dog barks all night and I'm losing my temper.",
            "The cat eats twice a day and sleeps by the window.",
            "Our old dog died this morning and the house feels empty.",
            "The vet says the cat needs an operation and I'm scared for her.",
            "The hamster escaped and we found it in the piano!"],
}
STATEMENTS = [s for v in TOPICS.values() for s in v]
import sys, tempfile, json
from pathlib import Path
import numpy as np
from miita_edge import Miita
from miita_edge.evaluation.benchmarks import get_benchmark, load_benchmark
from miita_edge.method import key_whitening as kw, key_axes as ka
from miita_edge.method.calibration import CALIBRATION_INPUTS, raw_key

model = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "gemma" else None
tag = "gemma" if model is None else "smollm2"
out = Path(f"/work/probe/keys-{tag}.npz")
if not out.exists():
    data = {}
    for bname, ddir, keep in [("banking77", "../shared/data/banking77", None),
                              ("superni", "../shared/data/superni", ("task363_sst2_polarity_classification",
                               "task1687_sentiment140_classification", "task875_emotion_classification"))]:
        spec = get_benchmark(bname)
        _, stages = load_benchmark(spec, Path(ddir), split="dev")
        with tempfile.TemporaryDirectory() as tmp, Miita(model, Path(tmp) / "mem", template=spec.template) as m:
            eng = m.keyed_engine()
            K = lambda xs: np.stack([raw_key(eng, m.template, x, m.preset.skip_bos) for x in xs]).astype(np.float32)
            for s in stages:
                if keep and s.name not in keep:
                    continue
                tr = s.train if keep is None else s.train[:20]
                data[f"{bname}|{s.name}|train"] = K([e.input for e in tr]); data[f"{bname}|{s.name}|train_y"] = np.array([e.output for e in tr])
                data[f"{bname}|{s.name}|dev"] = K([it.example.input for it in s.test]); data[f"{bname}|{s.name}|dev_y"] = np.array([it.example.output for it in s.test])
            if bname == "banking77":
                data["para"] = kw.paraphrase_keys(eng, m.template, m.preset.skip_bos, m.fingerprint())
                data["calib"] = K(CALIBRATION_INPUTS); data["stmt"] = K(STATEMENTS)
                data["mean"] = np.asarray(m.bank.key_mean, np.float32); data["parts"] = len(m.key_layers)
                data["order"] = np.asarray(m.bank.key_order)
    np.savez(out, **data)
d = dict(np.load(out))
parts = int(d["parts"]); mean = d["mean"].astype(np.float16).astype(np.float32); order = d["order"]
prep = lambda r: kw.prepared(r, mean, parts)
zp = prep(np.concatenate([d["para"], d["calib"]]))
zs = prep(np.concatenate([d["para"], d["calib"], d["stmt"]]))
F = {"coordinates": np.eye(zp.shape[1])[order]}
for name, z in (("axes", zp), ("axes+statements", zs)):
    R = ka.leading_axes(z, order)
    F[name] = R
    F[name + " unit"] = ka.unit_rows_of(R, z)

def acc(train, ty, dev, dy, R, K):
    labels = sorted(set(ty.tolist())); idx = {l: i for i, l in enumerate(labels)}
    zt = prep(train) @ R[:K].T; zt /= np.linalg.norm(zt, axis=1, keepdims=True)
    C = np.zeros((len(labels), K))
    for i, l in enumerate(ty): C[idx[l]] += zt[i]
    B = np.where(C >= 0, 1.0, -1.0)
    q = prep(dev) @ R[:K].T
    pred = np.array(labels)[np.argmax(q @ B.T, axis=1)]
    return 100 * np.mean(pred == dy)

stages_b = sorted({k.split("|")[1] for k in d if k.startswith("banking77|")})
tr = np.concatenate([d[f"banking77|{s}|train"] for s in stages_b]); ty = np.concatenate([d[f"banking77|{s}|train_y"] for s in stages_b])
dv = np.concatenate([d[f"banking77|{s}|dev"] for s in stages_b]); dy = np.concatenate([d[f"banking77|{s}|dev_y"] for s in stages_b])
print(f"{tag}: frame, Banking77 @104/112/168 bits | SuperNI sst2, sentiment140, emotion @112/168 (within-task vote, 20 train rows)")
for name, R in F.items():
    row = [f"{acc(tr, ty, dv, dy, R, K):.1f}" for K in (104, 112, 168)]
    for s in ("task363_sst2_polarity_classification", "task1687_sentiment140_classification", "task875_emotion_classification"):
        row += [f"{acc(d[f'superni|{s}|train'], d[f'superni|{s}|train_y'], d[f'superni|{s}|dev'], d[f'superni|{s}|dev_y'], R, K):.0f}" for K in (112, 168)]
    print(f"{name:22s} B77 {' '.join(row[:3])} | sni {' '.join(row[3:])}")
