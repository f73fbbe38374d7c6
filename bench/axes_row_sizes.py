"""One question, retired after its answer (docs/tried.md): how unequal are the rows of the leading-axes
frame in the float vote? The root mean square of each row over the general prompts (the paraphrase groups and
calibration inputs, prepared as keys), read from the user cache of a model that built them:
    python bench/axes_row_sizes.py TAG   (the cache files' tag: model sha, template, layers, pooling, e.g.
    a5fd3b62230aa5ec-banking77-L15_12-bos0-Plast_mean for Gemma-3-270M through Banking77's template)"""
import sys, glob, numpy as np
from miita_edge.method import key_axes as ka, key_whitening as kw
from miita_edge.method.calibration import key_order
c = "/root/.cache/miita-edge/"
tag = sys.argv[1]
keys = np.load(c + f"keys-{tag}.npy"); para = np.load(c + f"paraphrase-keys-{tag}-v1.npy")
parts = 2
mean = keys.mean(0).astype(np.float16).astype(np.float32)
order = key_order(keys, parts, None)
raw = np.concatenate([para, keys]); z = kw.prepared(raw, mean, parts)
R = ka.leading_axes(z, order); P = R.shape[0] - R.shape[1]
rms = np.sqrt(np.mean((z @ R.T) ** 2, axis=0))
print(f"P={P} axes; rms axis 1 {rms[0]:.4f}, axis 10 {rms[9]:.4f}, axis 50 {rms[49]:.4f}, axis 112 {rms[111]:.4f}, last axis {rms[P-1]:.5f}; coordinates median {np.median(rms[P:]):.4f}")
for m in (112, 300, 900):
    w2 = rms[:m] ** 2
    print(f"first {m} rows: share of the float query's squared size on the axes rows {w2[:min(m,P)].sum() / w2.sum():.3f}; on the first 10 rows {w2[:10].sum() / w2.sum():.3f}")
