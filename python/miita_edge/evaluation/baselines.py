"""Two outside baselines of the continual-learning runner, held to the same byte budget.

* :class:`SemanticMem` — paper appendix C.2: prototypes of *semantic* embeddings merged by
  semantic redundancy, used through MIITA's retrieval interface, with no correction information.
* :class:`KnnLM` — a byte-budgeted kNN-LM datastore (Khandelwal et al., ICLR 2020): keys are the
  final hidden states (the LM head's input) at the positions that predict an answer token,
  values the token; at every decoding step the model's distribution is interpolated with the
  neighbours' distribution.

Both learn from one teacher-forced pass per example (:func:`target_states`) and count the bytes
of their arrays' contents (as ``example-mem`` counts its text and keys; no file framing).
The choices the sources leave open are listed in docs/evaluation.md ("semantic-mem", "knn-lm").
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..memory import codecs
from ..runtime.key_pooling import key_mean
from ..errors import BudgetError, InputError
from .methods import Method, generate_text
from ..streams import Example

__all__ = ["KnnLM", "SemanticMem", "TargetStates", "knn_distribution", "knn_lm_mix", "priority", "target_states"]


@dataclass
class TargetStates:
    key: np.ndarray  # (H,) mean-pooled key layer over the prompt rows (BOS row included or not)
    target: list[int]  # answer tokens y_1..y_L (stop newline included)
    hidden: np.ndarray  # (L, H) result_norm rows at the positions that predict y_1..y_L


def target_states(engine, template, x: str, y: str, *, skip_bos: bool,
                  max_prompt_tokens: int | None) -> TargetStates | None:
    """One decode of prompt + answer: the key and the LM head's inputs that predict each answer
    token (teacher forcing). None for an empty answer."""
    from ..method.extract import prompt_and_target

    pt = prompt_and_target(engine, template, x, y, skip_bos=skip_bos, max_prompt_tokens=max_prompt_tokens)
    if pt is None:
        return None
    prompt, target, mask = pt
    engine.reset()
    flags = [False] * (len(prompt) - 1) + [True] * len(target) + [False]
    hidden = engine.hidden_states(prompt + target, flags, key_mask=mask + [False] * len(target))
    s, n = engine.key_sum()
    return TargetStates(key_mean(np.asarray(s, np.float64), n), list(target), hidden.astype(np.float32))


def cached_target_states(ctx, ex: Example, skip_bos: bool) -> TargetStates | None:
    """:func:`target_states` through the run's extract cache (``Context.cached``)."""
    eng, tpl = ctx.engine, ctx.template

    def compute():
        ts = target_states(eng, tpl, ex.input, ex.output, skip_bos=skip_bos, max_prompt_tokens=ctx.max_prompt_tokens)
        return None if ts is None else {"key": ts.key, "target": np.asarray(ts.target, np.int64), "hidden": ts.hidden}

    a = ctx.cached("target_states", {"prompt": tpl.render_prompt(ex.input), "target": tpl.render_target(ex.output),
                                     "skip_bos": skip_bos, "max_prompt_tokens": ctx.max_prompt_tokens,
                                     "key_layers": [int(k) for k in eng.key_layers]}, compute)
    return None if a is None else TargetStates(a["key"], [int(t) for t in a["target"]], a["hidden"])


def priority(*parts: str | bytes) -> float:
    """A reproducible uniform(0, 1) draw from stored content: keeping the highest priorities that
    fit is a uniform random sample of the stream (bottom-k sampling), the same on every rerun, and
    it needs no extra stored state because it is recomputed from what is kept."""
    h = hashlib.sha256()
    for p in parts:
        b = p if isinstance(p, bytes) else p.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return int.from_bytes(h.digest()[:8], "little") / 2.0 ** 64


def _unit(v: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(v, axis=-1, keepdims=True)
    return v / np.maximum(n, 1e-12)


# ============================================================================ SemanticMem
class SemanticMem(Method):
    """Semantic prototypes (appendix C.2): (key centroid k_j, answer-state centroid s_j, count n_j).

    * Embeddings: the paper preset's key as that preset forms it (mean of the key layer over the
      prompt without the BOS row, centred on the model's calibration mean, f32) — "the same
      retrieval backbone" — and s = Norm(mean of the final hidden states that predict the answer
      tokens): what the answer looks like where the update is applied. Neither holds a correction
      (no e_y − p term). Version 1 compared uncentred keys; on Gemma-3-270M those all lie within
      cosine τ_k of each other, so every write merged into one prototype.
    * Write: merge into the prototype of largest key cosine if it is ≥ τ_k = 0.80 (running
      averages of k and s), else a new prototype. Repair while over budget: merge the most
      key-similar pair (count-weighted) — semantic-redundancy compression; one prototype that still
      does not fit is a budget error.
    * Use: the M = 4 prototypes of largest key cosine, softmax(cos / T_agg = 0.2) weights,
      d̄ = Norm(Σ w_j s_j), added as η·‖h_q‖·α_t·d̄ at every step with the paper preset's η and gate.
    """

    TAU_K, M, T_AGG = 0.80, 4, 0.2
    VERSION = 2
    FILES = ("keys.npy", "states.npy", "counts.npy")

    def setup(self, ctx):
        super().setup(ctx)
        from ..miita import paper_preset

        self.preset = paper_preset()
        self._mean: np.ndarray | None = None
        self.reset()

    def provenance(self) -> dict:
        # Results of version 1 (uncentred keys) must not pass for this version's.
        return {"preset": "semantic-mem", "version": self.VERSION}

    def _engine(self):
        """The run's engine, pooling keys from the paper preset's layer (an engine may have been
        left on other layers by an earlier use)."""
        eng = self.ctx.engine
        layers = tuple(self.preset.key_layers(eng.n_layer))
        pooling = tuple(self.preset.key_poolings(eng.n_layer))
        if (tuple(eng.key_layers), tuple(eng.key_pooling)) != (layers, pooling):
            eng.set_key_layers(layers, pooling)
        return eng

    def centring(self) -> np.ndarray:
        """The paper preset's centring vector: the mean raw key of the calibration inputs through
        the run's template (model and template only; not stored, not counted in the budget, as
        for the paper preset's own memories)."""
        if self._mean is None:
            from ..method.calibration import calibration_keys
            from ..runtime.fingerprint import model_sha256

            eng = self._engine()
            fp = {"sha256": model_sha256(eng.info.path), "key_layer": eng.key_layers[0]}
            keys = calibration_keys(eng, self.ctx.template, self.preset.skip_bos, fp)
            self._mean = keys.astype(np.float64).mean(axis=0)
        return self._mean

    def reset(self):
        H = self.ctx.engine.n_embd
        self.K = np.zeros((0, H), np.float32)
        self.S = np.zeros((0, H), np.float32)
        self.n = np.zeros(0, np.int32)

    def item_bytes(self) -> int:
        H = self.ctx.engine.n_embd
        return 2 * 4 * H + 4

    def memory_bytes(self) -> int:
        return int(self.K.nbytes + self.S.nbytes + self.n.nbytes)

    def _write(self, k: np.ndarray, s: np.ndarray) -> None:
        if len(self.K):
            cos = _unit(self.K.astype(np.float64)) @ _unit(k)
            j = int(np.argmax(cos))
            if cos[j] >= self.TAU_K:
                c = float(self.n[j])
                self.K[j] = (c * self.K[j] + k) / (c + 1)
                self.S[j] = _unit((c * self.S[j] + s) / (c + 1))
                self.n[j] += 1
                return
        self.K = np.vstack([self.K, k[None].astype(np.float32)])
        self.S = np.vstack([self.S, s[None].astype(np.float32)])
        self.n = np.append(self.n, np.int32(1))

    def _repair(self) -> None:
        budget = self.ctx.budget_bytes
        while budget is not None and self.memory_bytes() > budget:
            if len(self.K) <= 1:
                raise BudgetError(f"semantic-mem: one prototype takes {self.item_bytes()} bytes, more than the "
                                  f"budget of {budget} bytes")
            U = _unit(self.K.astype(np.float64))
            C = U @ U.T
            np.fill_diagonal(C, -np.inf)
            a, b = np.unravel_index(int(np.argmax(C)), C.shape)
            a, b = min(a, b), max(a, b)
            ca, cb = float(self.n[a]), float(self.n[b])
            self.K[a] = (ca * self.K[a] + cb * self.K[b]) / (ca + cb)
            self.S[a] = _unit((ca * self.S[a] + cb * self.S[b]) / (ca + cb))
            self.n[a] += self.n[b]
            keep = np.arange(len(self.K)) != b
            self.K, self.S, self.n = self.K[keep], self.S[keep], self.n[keep]

    def learn(self, stage_examples: list[Example]) -> None:
        c = self.ctx
        self._engine()
        for ex in stage_examples:
            ts = cached_target_states(c, ex, self.preset.skip_bos)
            if ts is None:
                continue
            k = (ts.key.astype(np.float64) - self.centring()).astype(np.float32)
            self._write(k, _unit(ts.hidden.astype(np.float64).mean(axis=0)))
            self._repair()

    def retrieve(self, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(prototype ids by score, softmax weights) for a centred query key."""
        if not len(self.K):
            return np.zeros(0, np.int64), np.zeros(0)
        cos = _unit(self.K.astype(np.float64)) @ _unit(np.asarray(key, np.float64))
        ids = np.lexsort((np.arange(len(cos)), -cos))[:self.M]
        z = cos[ids] / self.T_AGG
        w = np.exp(z - z.max())
        return ids.astype(np.int64), w / w.sum()

    def predict(self, examples):
        from ..method.extract import prompt_tokens

        eng, c, pr = self._engine(), self.ctx, self.preset
        out = []
        for ex in examples:
            st = eng.query(prompt_tokens(eng, c.template, ex.input, c.max_prompt_tokens), skip_bos_in_key=pr.skip_bos)
            ids, w = self.retrieve(np.asarray(st.key, np.float64) - self.centring())
            plan = None
            if ids.size:
                d = _unit((w[:, None] * self.S[ids].astype(np.float64)).sum(axis=0)).astype(np.float32)
                plan = (lambda step, gen, d=d: d)
            eta = pr.eta * float(np.linalg.norm(st.h_q))
            out.append(eng.generate(st, max_tokens=c.max_tokens, plan=plan, eta=eta, mode=pr.gate).text)
        return out

    def save(self, dst):
        dst.mkdir(parents=True)
        for name, arr in zip(self.FILES, (self.K, self.S, self.n)):
            np.save(dst / name, arr)

    def load(self, src):
        K, S, n = (np.load(Path(src) / f) for f in self.FILES)
        if not (len(K) == len(S) == len(n)):
            raise InputError(f"{src}: semantic-mem arrays disagree in length")
        self.K, self.S, self.n = K, S, n


# ============================================================================ kNN-LM
def knn_distribution(h: np.ndarray, keys: np.ndarray, values: np.ndarray, k: int) -> dict[int, float]:
    """p_kNN over the values of the k nearest keys (squared L2), weights softmax(−d_i / τ) with
    τ = the mean of the k distances: only relative distances matter, so the weighting does not
    depend on the model's hidden scale (Khandelwal et al. use τ = 1 on their model's scale).
    Ties in distance go to the older entry."""
    d = ((keys.astype(np.float64) - np.asarray(h, np.float64)) ** 2).sum(axis=1)
    nn = np.lexsort((np.arange(len(d)), d))[:k]
    dn = d[nn]
    tau = max(float(dn.mean()), 1e-12)
    w = np.exp(-(dn - dn.min()) / tau)
    w /= w.sum()
    p: dict[int, float] = {}
    for i, wi in zip(nn, w):
        v = int(values[i])
        p[v] = p.get(v, 0.0) + float(wi)
    return p


def knn_lm_mix(logits: np.ndarray, h: np.ndarray, keys: np.ndarray, values: np.ndarray, k: int,
               lam: float) -> np.ndarray:
    """λ·p_kNN + (1 − λ)·softmax(logits) over the vocabulary (float64); the model's alone when the
    datastore is empty."""
    z = np.asarray(logits, np.float64)
    p = np.exp(z - z.max())
    p /= p.sum()
    if len(keys):
        p *= 1.0 - lam
        for v, pv in knn_distribution(h, keys, values, k).items():
            p[v] += lam * pv
    return p


class KnnLM(Method):
    """kNN-LM (Khandelwal et al. 2020) with a byte budget.

    * Datastore: one entry per answer token of every learned example: key = the final hidden state
      that predicts it (teacher forcing), value = the token. Only answer positions are stored: the
      prompts are instructions and inputs, not what the model should learn to say.
    * Storage: keys int8 with a float32 scale per key (H + 4 bytes), values int32: 648 bytes per
      entry on Gemma-3-270M. Budget: every entry gets a reproducible uniform priority from its
      content; the highest priorities that fit are kept — a uniform sample of the whole stream,
      so early stages are not evicted first.
    * Use: at every step, p = λ·p_kNN + (1 − λ)·p_LM over the k = 8 nearest keys, λ = 0.25 (the
      paper's best on Wikitext-103), greedy; the same stop rule as every method (newline).
    """

    K_NEIGHBOURS, LAMBDA = 8, 0.25
    FILES = ("keys.npy", "scales.npy", "values.npy")

    def setup(self, ctx):
        super().setup(ctx)
        self.reset()

    def reset(self):
        H = self.ctx.engine.n_embd
        self.q = np.zeros((0, H), np.int8)
        self.scale = np.zeros(0, np.float32)
        self.values = np.zeros(0, np.int32)
        self._keys_f = None

    @property
    def entry_bytes(self) -> int:
        return self.ctx.engine.n_embd + 4 + 4

    def memory_bytes(self) -> int:
        return int(self.q.nbytes + self.scale.nbytes + self.values.nbytes)

    def keys(self) -> np.ndarray:
        if self._keys_f is None:
            self._keys_f = codecs.decode({"data": self.q, "scale": self.scale}, "int8", self.ctx.engine.n_embd)
        return self._keys_f

    def learn(self, stage_examples):
        c = self.ctx
        budget = c.budget_bytes
        if budget is not None and budget < self.entry_bytes:
            raise BudgetError(f"knn-lm: one entry takes {self.entry_bytes} bytes, more than the budget of "
                              f"{budget} bytes")
        for ex in stage_examples:
            ts = cached_target_states(c, ex, skip_bos=False)  # the key is not used
            if ts is None:
                continue
            enc = codecs.encode(ts.hidden, "int8")
            self.q = np.vstack([self.q, enc["data"]])
            self.scale = np.concatenate([self.scale, np.asarray(enc["scale"], np.float32).reshape(-1)])
            self.values = np.concatenate([self.values, np.asarray(ts.target, np.int32)])
            if budget is not None and self.memory_bytes() > budget:
                prio = self.priorities()
                keep = np.sort(np.argsort(-prio, kind="stable")[:budget // self.entry_bytes])  # order kept
                self.q, self.scale, self.values = self.q[keep], self.scale[keep], self.values[keep]
        self._keys_f = None

    def priorities(self) -> np.ndarray:
        """Each entry's retention priority, from its stored key and value."""
        return np.array([priority(q.tobytes(), int(v).to_bytes(4, "little", signed=True))
                         for q, v in zip(self.q, self.values)])

    def predict(self, examples):
        from ..method.extract import prompt_tokens

        eng, c = self.ctx.engine, self.ctx
        keys = self.keys()
        out = []
        for ex in examples:
            st = eng.query(prompt_tokens(eng, c.template, ex.input, c.max_prompt_tokens))
            logits, h = st.logits, st.h_q
            generated: list[int] = []
            text = b""
            for step in range(c.max_tokens):
                if step > 0:
                    eng.native.set_capture(True, 1)
                    try:
                        logits = eng.decode([generated[-1]], "last")[0]
                        h = eng.native.captured()[0].copy()
                    finally:
                        eng.native.set_capture(False, 0)
                tok = int(np.argmax(knn_lm_mix(logits, h, keys, self.values, self.K_NEIGHBOURS, self.LAMBDA)))
                if eng.is_eog(tok):
                    break
                generated.append(tok)
                text += eng.token_bytes(tok)
                if b"\n" in text:
                    break
            out.append(text.decode("utf-8", errors="replace").split("\n", 1)[0])
        return out

    def save(self, dst):
        dst.mkdir(parents=True)
        for name, arr in zip(self.FILES, (self.q, self.scale, self.values)):
            np.save(dst / name, arr)

    def load(self, src):
        q, s, v = (np.load(Path(src) / f) for f in self.FILES)
        if not (len(q) == len(s) == len(v)):
            raise InputError(f"{src}: knn-lm arrays disagree in length")
        self.q, self.scale, self.values = q, s, v
        self._keys_f = None


class ExampleMem(Method):
    """Retrieved (x, y) examples placed in the prompt as demonstrations.

    Memory: the kept examples' UTF-8 text plus one 1-bit key each (the default preset's key:
    BOS row dropped, centred on the calibration mean, sign per dimension: H/8 bytes). Budget:
    after each new example, while the bytes exceed the budget the example of lowest retention
    priority is evicted — a reproducible uniform draw from its text
    (``baselines.priority``), so what is kept is a uniform sample of the whole stream and early
    stages are not forgotten first (evicting the oldest would make BWT a property of the policy).
    Retrieval: cosine of the query's prepared key with the stored ±1 keys, top-4 (ties: older
    first); demonstrations are placed least similar first, so the best sits next to the query.
    Each demonstration's prompt is cut like any prompt; if the whole prompt still does not fit
    the context, the least similar demonstrations are dropped.
    """

    TOP_K = 4
    FILES = ("examples.jsonl", "keys.npy")

    def setup(self, ctx):
        super().setup(ctx)
        from ..miita import Miita

        # Only for its key preparation (calibration mean, centring); never ingested into, so its
        # directory is never created.
        # The default preset as it was when this baseline was defined (middle-layer keys): a baseline
        # does not change when our preset does (its numbers are kept across preset versions).
        from ..method.presets import default_preset_v1

        self._keyer = Miita(memory=ctx.work_dir / "keyer-unused", preset=default_preset_v1(),
                            template=ctx.spec.template, engine=ctx.engine)
        self.n_key_bytes = (ctx.engine.n_embd + 7) // 8
        self.reset()

    def reset(self):
        self.items: list[tuple[str, str]] = []
        self.keys: list[np.ndarray] = []  # packed bits, uint8 (n_key_bytes,)

    def _key(self, x: str) -> np.ndarray:
        from ..method.extract import prompt_tokens

        eng, c = self._keyer.keyed_engine(), self.ctx  # the keyer's layer, whoever used the engine last

        def compute():
            st = eng.query(prompt_tokens(eng, c.template, x, c.max_prompt_tokens), skip_bos_in_key=True)
            return {"key": np.asarray(st.key)}

        a = c.cached("query_key", {"prompt": c.template.render_prompt(x), "skip_bos": True,
                                   "max_prompt_tokens": c.max_prompt_tokens}, compute)
        return self._keyer.bank.prepare_key(a["key"])

    @staticmethod
    def item_bytes(x: str, y: str, key_bytes: int) -> int:
        return len(x.encode("utf-8")) + len(y.encode("utf-8")) + key_bytes

    def memory_bytes(self) -> int:
        return sum(self.item_bytes(x, y, self.n_key_bytes) for x, y in self.items)

    def learn(self, stage_examples):
        from ..memory import codecs

        for ex in stage_examples:
            bits = codecs.encode(self._key(ex.input)[None], "bit")["data"][0]
            self.items.append((ex.input, ex.output))
            self.keys.append(bits)
            total = self.memory_bytes()
            while self.items and self.ctx.budget_bytes is not None and total > self.ctx.budget_bytes:

                i = min(range(len(self.items)), key=lambda j: (priority(*self.items[j]), j))
                x, y = self.items.pop(i)
                self.keys.pop(i)
                total -= self.item_bytes(x, y, self.n_key_bytes)

    def retrieve(self, x: str) -> list[int]:
        """Indices of the retrieved examples, least similar first."""
        from ..memory import codecs
        from ..method.steering import anchor_scores

        if not self.items:
            return []
        K = codecs.decode({"data": np.stack(self.keys)}, "bit", self.ctx.engine.n_embd)
        s = anchor_scores(self._key(x), K)
        top = np.lexsort((np.arange(len(s)), -s))[:self.TOP_K]
        return [int(i) for i in top[::-1]]

    def prompt(self, x: str, demos: list[int]) -> list[int]:
        from ..method.extract import prompt_tokens

        eng, tpl, mpt = self.ctx.engine, self.ctx.template, self.ctx.max_prompt_tokens

        def body(t: list[int]) -> list[int]:
            return t[1:] if t and t[0] == eng.bos and eng.add_bos else t

        toks = [eng.bos] if eng.add_bos else []
        for i in demos:
            dx, dy = self.items[i]
            toks += body(prompt_tokens(eng, tpl, dx, mpt)) + eng.tokenize(tpl.render_target(dy), add_bos=False)
        return toks + body(prompt_tokens(eng, tpl, x, mpt))

    def predict(self, examples):
        eng, c = self.ctx.engine, self.ctx
        out = []
        for ex in examples:
            demos = self.retrieve(ex.input)
            toks = self.prompt(ex.input, demos)
            while demos and len(toks) + c.max_tokens + 1 > eng.config.n_ctx:
                demos = demos[1:]
                toks = self.prompt(ex.input, demos)
            out.append(generate_text(eng, toks, c.max_tokens))
        return out

    def save(self, dst):
        dst.mkdir(parents=True)
        with open(dst / "examples.jsonl", "w", encoding="utf-8") as fh:
            for x, y in self.items:
                fh.write(json.dumps({"input": x, "output": y}, ensure_ascii=False) + "\n")
        np.save(dst / "keys.npy", np.stack(self.keys) if self.keys else np.zeros((0, self.n_key_bytes), np.uint8))

    def load(self, src):
        rows = [json.loads(line) for line in (src / "examples.jsonl").read_text("utf-8").splitlines() if line]
        keys = np.load(src / "keys.npy")
        if len(keys) != len(rows):
            raise InputError(f"{src}: {len(rows)} examples but {len(keys)} keys")
        self.items = [(r["input"], r["output"]) for r in rows]
        self.keys = [k.copy() for k in keys]
