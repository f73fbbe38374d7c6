"""The LM head's geometry: directions that make a target token win on any head, and how hard to push.

Why this exists: adding ``Norm(W[y])`` to the final hidden state raises token y's logit most only
when every head row has the same norm and the rows have no common component (Gemma-3-270M, by
accident). On a head whose rows share a large mean and whose norms vary 4x (SmolLM2-135M), the same
addition raises the largest-norm rows more than y's own, and the memory answers garbage. Two facts
of the model fix this without tuning anything on data:

- **Direction.** Logits are ``c·W h``, so adding δ moves token j's logit by ``c·W_j·δ``. A direction
  only has to raise y *relative to the other rows*; the head's mean row μ moves every logit alike and
  is useless, and a covariance Σ of the centred rows says which directions move many rows at once.
  ``d_y = Σ⁻¹(W_y − μ) / ((W_y − μ)ᵀ Σ⁻¹ (W_y − μ))`` is the direction of least Σ-weighted effect
  that raises y by exactly one logit over the average row: on an isotropic head it is ``Norm(W_y)``
  up to scale, on an anisotropic one it turns away from the directions shared with many rows.
  It is invariant to rewrites that leave the softmax unchanged: adding one vector to every head row
  (μ absorbs it) and scaling the final norm by s with the head by 1/s (``d_y`` scales by s, so
  ``W·δ`` is unchanged).
- **Push.** With ``d_y`` in logit units, the scale of the addition is a logit margin ``G``. It is
  measured on the model: for neutral calibration prompts (the states that predict an answer's first
  token) and a fixed sample of ordinary word tokens, the smallest step ``t`` along ``d_y`` that
  makes y the argmax is exact (logits are linear in the addition), and ``G`` is the 99th percentile
  of those steps: a push under which an arbitrary word wins at 99 of 100 such states.

The statistics cost one pass over the head (plus 16 prompt passes), a few seconds, and are cached per
model and template in the user cache directory; at ask time a direction is one H×H product per
answer token, computed once per query, and the decode step itself costs nothing more.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime.engine import Engine
from ..runtime.fingerprint import cache_dir, write_cached
from .calibration import CALIBRATION_INPUTS
from .templates import Template

__all__ = ["HeadGeometry", "head_geometry", "head_statistics", "needed_steps", "word_tokens"]

#: Rows per chunk when streaming the head (42 MB of float32 at width 640).
CHUNK = 16384
#: Every how many rows the covariance samples (a quarter of the vocabulary is plenty for H ≤ 4096).
COV_STRIDE = 4
#: Ridge on the covariance, relative to its mean eigenvalue: keeps Σ⁻¹ finite on a head whose rows
#: span fewer than H dimensions, and is far below the spread of any real head's eigenvalues.
RIDGE = 1e-3
#: Ordinary word tokens sampled for the push, and the percentile of the steps they need.
N_WORDS = 64
PUSH_PERCENTILE = 99.0
VERSION = 1  # of the cached statistics' layout


@dataclass(frozen=True)
class HeadGeometry:
    """What the directions and the push need of one model's head (float64)."""

    mean: np.ndarray  # (H,) the mean head row μ
    precision: np.ndarray  # (H, H) (Σ + ridge·I)⁻¹
    push: float  # G: the logit margin an addition brings (see the module docstring)
    logit_mult: float = 1.0  # c in logits = c·W·h

    def direction(self, row: np.ndarray) -> np.ndarray:
        """``d_y`` for the head row ``W_y``: raises y's logit by exactly 1 over the average row's
        (float32, (H,)). A row equal to μ has no such direction: zeros (it cannot be steered)."""
        c = np.asarray(row, np.float64) - self.mean
        d = self.precision @ c
        gain = float(c @ d) * self.logit_mult
        if not np.isfinite(gain) or gain <= 0:
            return np.zeros_like(c, dtype=np.float32)
        return (d / gain).astype(np.float32)


def head_statistics(engine: Engine, stride: int = COV_STRIDE) -> tuple[np.ndarray, np.ndarray]:
    """(μ, (Σ + ridge·I)⁻¹) of the head rows, streamed in chunks (the head is never held dense);
    the covariance from every ``stride``-th row."""
    lm = engine.lm_head
    V, H = lm.head.n_vocab, lm.head.n_embd
    total = np.zeros(H, np.float64)
    for a in range(0, V, CHUNK):
        total += lm.rows(np.arange(a, min(V, a + CHUNK))).sum(axis=0, dtype=np.float64)
    mu = total / V
    S = np.zeros((H, H), np.float64)
    n = 0
    for a in range(0, V, CHUNK):
        R = lm.rows(np.arange(a, min(V, a + CHUNK), stride)).astype(np.float64) - mu
        S += R.T @ R
        n += len(R)
    S /= max(n, 1)
    ridge = RIDGE * float(np.trace(S)) / H
    return mu, np.linalg.inv(S + ridge * np.eye(H))


def word_tokens(engine: Engine, n: int = N_WORDS) -> list[int]:
    """``n`` ordinary word tokens of the vocabulary: a leading space (or SentencePiece's ▁) and then
    at least three lower-case ASCII letters; read in a fixed pseudo-random order, so the sample is
    the same on every machine."""
    V = engine.n_vocab
    out: list[int] = []
    for t in np.random.default_rng(0).permutation(V):
        s = engine.token_bytes(int(t)).decode("utf-8", "ignore")
        if s[:1] in (" ", "\u2581") and len(s) >= 4 and s[1:].isascii() and s[1:].isalpha() and s[1:].islower():
            out.append(int(t))
            if len(out) == n:
                break
    return out


def needed_steps(engine: Engine, mean: np.ndarray, precision: np.ndarray, states: np.ndarray,
                 tokens: list[int], logit_mult: float = 1.0) -> np.ndarray:
    """For each (state h, token y): the least t >= 0 with y = argmax of c·W(h + t·d_y) (inf where no
    t does). Exact, since the logits are linear in t: y beats row j for t above (z_j − z_y)/(g_y − g_j)
    where j gains less than y (g_j < g_y), below that ratio where j gains more, and never or always
    where both gain alike; so y wins on an interval of t, and this is its lower end.
    Returns (len(states), len(tokens)); streamed over the head in chunks."""
    lm = engine.lm_head
    V = lm.head.n_vocab
    geo = HeadGeometry(mean, precision, 1.0, logit_mult)
    Wy = lm.rows(tokens).astype(np.float64)
    D = np.stack([geo.direction(w) for w in Wy]).astype(np.float64)  # (Y, H)
    Hs = np.asarray(states, np.float64)
    zy = logit_mult * (Hs @ Wy.T)  # (S, Y)
    gy = logit_mult * np.einsum("yh,yh->y", Wy, D)  # (Y,)
    low = np.zeros((len(Hs), len(tokens)), np.float64)
    high = np.full((len(Hs), len(tokens)), np.inf)
    tok = np.asarray(tokens)
    for a in range(0, V, CHUNK):
        ids = np.arange(a, min(V, a + CHUNK))
        R = lm.rows(ids).astype(np.float64)
        z = logit_mult * (Hs @ R.T)  # (S, n)
        g = logit_mult * (D @ R.T)  # (Y, n)
        for k in range(len(tokens)):
            dz = z - zy[:, k:k + 1]  # (S, n): how far row j is ahead of y now
            dg = (gy[k] - g[k])[None, :]  # (1, n): how much faster y rises than row j
            other = (ids != tok[k])[None, :]
            ratio = dz / np.where(dg != 0, dg, 1.0)
            low[:, k] = np.maximum(low[:, k], np.where(other & (dg > 0), ratio, -np.inf).max(axis=1))
            high[:, k] = np.minimum(high[:, k], np.where(other & (dg < 0), ratio, np.inf).min(axis=1))
            never = (other & (dg == 0) & (dz >= 0)).any(axis=1)
            high[never, k] = -np.inf
    return np.where(low < high, low, np.inf)


def _states(engine: Engine, template: Template) -> np.ndarray:
    """The final hidden state at the last prompt row of each calibration input (what predicts an
    answer's first token)."""
    return np.stack([engine.query(engine.tokenize(template.render_prompt(x))).h_q for x in CALIBRATION_INPUTS])


def head_geometry(engine: Engine, template: Template, sha256: str) -> HeadGeometry:
    """The head's geometry for ``template``'s prompts, computed once per (model, template) and cached
    in the user cache directory (an unreadable or malformed cache is recomputed; an unwritable one
    only costs time)."""
    H = engine.n_embd
    path = cache_dir() / f"head-{sha256[:16]}-{template.name}-v{VERSION}.npz"
    try:
        with np.load(path) as f:
            mu, P, push = f["mean"], f["precision"], float(f["push"])
        if mu.shape == (H,) and P.shape == (H, H) and np.isfinite(P).all() and np.isfinite(push) and push > 0:
            return HeadGeometry(mu, P, push, engine.info.logit_mult)
    except (OSError, ValueError, KeyError):
        pass
    mu, P = head_statistics(engine)
    steps = needed_steps(engine, mu, P, _states(engine, template), word_tokens(engine), engine.info.logit_mult)
    finite = steps[np.isfinite(steps)]
    push = float(np.percentile(finite, PUSH_PERCENTILE)) if finite.size else 0.0
    if not push > 0:
        raise ValueError("the head's calibration gave no finite push (no word token can be made the argmax)")
    write_cached(path, lambda tmp: np.savez(tmp, mean=mu, precision=P, push=np.float64(push)))
    return HeadGeometry(mu, P, push, engine.info.logit_mult)

