"""The answer job, run on the worker: pin the memory's committed version, build the prompt, answer
``n`` times, and describe what steered the answer (the ``miita`` object) and each token's logprob.
An answer stops at its next token when the server starts to stop or its streamed client has gone
(``Stopped``), so neither waits for ``max_tokens`` tokens nobody will read."""
from __future__ import annotations

import codecs
from dataclasses import dataclass, field

import numpy as np

from ..method.extract import prompt_tokens
from ..method.templates import strip_lead
from . import chat as chat_mod
from .errors import APIError
from .params import GenParams


class Stopped(APIError):
    """An answer given up mid-way: ``tokens`` were generated before it stopped."""

    def __init__(self, message: str, code: str, tokens: int = 0):
        super().__init__(503, message, code)
        self.tokens = tokens


@dataclass
class Choice:
    text: str
    finish: str  # "stop" or "length"
    tokens: int  # tokens generated (the stop's own token included)
    logprobs: list[dict] | None = None  # one entry per token of ``text``


@dataclass
class Result:
    choices: list[Choice]
    prompt_tokens: int
    ext: dict = field(default_factory=dict)

    @property
    def usage(self) -> dict:
        done = sum(c.tokens for c in self.choices)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": done,
                "total_tokens": self.prompt_tokens + done}


def prompt_for(m, text: str, messages, adapt: bool) -> list[int]:
    """The memory template on the key text; unadapted chats use the GGUF's chat template if it has one."""
    eng = m.engine
    if messages is not None and not adapt:
        tmpl = eng.chat_template()
        if tmpl:
            return eng.tokenize(chat_mod.render_chat_template(tmpl, messages), add_bos=True)
    return prompt_tokens(eng, m.template, text, m.max_prompt_tokens)


class TokenTap:
    """``Engine.generate``'s ``on_logits`` hook, once per answer token: counts the tokens, streams
    the text so far (decoded incrementally with the final text's rule, so the streamed text is the
    answer's own prefix: invalid bytes become U+FFFD, an unfinished character waits), and records
    logprobs: the log-softmax of the logits the token was sampled from (steered ones when adapted;
    before temperature and top_p). The template's leading separator (``lead``) is not streamed,
    as ``Miita.ask`` does not return it."""

    def __init__(self, eng, k: int | None, on_text=None, lead: str = "", halt=None):
        self.eng, self.k, self.on_text, self.lead, self.halt = eng, k, on_text, lead, halt
        self.n, self.rows, self.text = 0, [], ""
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, tok: int, logits: np.ndarray) -> None:
        self.n += 1
        if self.halt is not None:
            why = self.halt()
            if why is not None:
                raise Stopped(why[0], why[1], self.n)
        b = self.eng.token_bytes(tok)
        if self.on_text is not None:
            piece = self._dec.decode(b)
            if piece:
                self.text += piece
                self.on_text(strip_lead(self.text, self.lead)[1])
        if self.k is not None:
            self.rows.append(self._logprobs(tok, b, logits))

    def _logprobs(self, tok: int, b: bytes, logits: np.ndarray) -> dict:
        z = logits.astype(np.float64)
        zmax = z.max()
        lse = zmax + np.log(np.exp(z - zmax).sum())
        top = []
        if self.k:
            ids = np.argpartition(-z, self.k - 1)[: self.k]
            ids = ids[np.argsort(-z[ids], kind="stable")]
            top = [self._entry(self.eng.token_bytes(int(t)), z[t] - lse) for t in ids]
        return dict(self._entry(b, z[tok] - lse), top_logprobs=top)

    @staticmethod
    def _entry(b: bytes, lp: float) -> dict:
        return {"token": b.decode("utf-8", "replace"), "logprob": float(lp), "bytes": list(b)}

    def cut(self, text: str) -> list[dict] | None:
        """The logprob entries of the tokens that start inside ``text`` (the generated text up to its
        stop, the leading separator included)."""
        if self.k is None:
            return None
        limit, at, out = len(text.encode("utf-8")), 0, []
        for row in self.rows:
            if at >= limit:
                break
            out.append(row)
            at += len(row["bytes"])
        return out


def answer_job(r, name: str | None, text: str, messages, p: GenParams, on_token=None, gone=None) -> Result:
    """On the worker. ``on_token(choice_index, text_so_far)`` streams; ``messages`` None: a completion;
    ``gone``: a ``threading.Event`` set when the stream's client has left."""
    m = r.memory(name)
    adapt = p.adapt and name is not None
    eng = m.engine
    toks = prompt_for(m, text, messages, adapt)
    if len(toks) + p.max_tokens > eng.config.n_ctx:
        raise APIError(400, f"prompt ({len(toks)} tokens) + max_tokens ({p.max_tokens}) exceeds the context of "
                       f"{eng.config.n_ctx} tokens", "context_length_exceeded", "max_tokens")
    def halt():
        if r.closing.is_set():
            return "the server is shutting down", "shutting_down"
        if gone is not None and gone.is_set():
            return "the client went away", "client_gone"
        return None

    choices, first = [], None
    for i in range(p.n):
        tap = TokenTap(eng, p.top_logprobs, None if on_token is None else (lambda so_far, i=i: on_token(i, so_far)),
                       lead=m.template.lead, halt=halt)
        try:
            ans = m.ask(text, max_tokens=p.max_tokens, adapt=adapt, stop=p.stop, temperature=p.temperature,
                        seed=(p.seed + i) % (1 << 63), top_p=p.top_p, prompt_tokens_override=toks, on_logits=tap)
        except Stopped:
            eng.reset()  # stopped inside generate: its steering and rows must not reach the next job
            raise
        first = first or ans
        finish = "length" if ans.stop_reason == "length" else "stop"
        choices.append(Choice(ans.text, finish, tap.n, tap.cut(ans.lead + ans.text)))
    return Result(choices, len(toks), describe(m, name, first, p))


def describe(m, name: str | None, ans, p: GenParams) -> dict:
    """The ``miita`` object: the version used, and what steered the answer (or why nothing did)."""
    ext = {"memory": name, "version": m.version if name else None, "adapted": ans.adapted}
    if p.task is not None:
        ext.update(reason="background_task", task=p.task)
    elif ans.adapted:
        steer = []
        seqs, counts = m.bank.answer_tokens(), m.bank.counts()  # views: no Prototype objects made
        for pid, s, w in zip(ans.prototypes, ans.scores, ans.weights):
            toks_j = seqs[pid]
            answer = (strip_lead(m.engine.detokenize([int(t) for t in toks_j]).rstrip("\n"), m.template.lead)[1]
                      if len(toks_j) else None)
            steer.append({"prototype": pid, "answer": answer, "weight": w, "score": s, "count": int(counts[pid])})
        ext.update(steered_by=steer, alphas=ans.alphas, eta=ans.eta)
    elif ans.reason:
        ext["reason"] = ans.reason  # why the memory did not steer (the relevance gate, adapt off, empty)
    return ext
