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
from .params import NEWLINE_STOP, GenParams


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
        self.n, self.rows, self.text, self.sizes = 0, [], "", []
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, tok: int, logits: np.ndarray) -> None:
        self.n += 1
        if self.halt is not None:
            why = self.halt()
            if why is not None:
                raise Stopped(why[0], why[1], self.n)
        b = self.eng.token_bytes(tok)
        self.sizes.append(len(b))
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

    def tokens_in(self, text: str) -> int:
        """How many of the tokens start inside ``text`` (the generated text's prefix)."""
        limit, at, n = len(text.encode("utf-8")), 0, 0
        for size in self.sizes:
            if at >= limit:
                break
            n, at = n + 1, at + size
        return n

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


REPLY_MARGIN = 8  # tokens past the longest taught answer: its end newline, a differing tokenisation


def reply_budget(m, adapt: bool, p: GenParams, prompt_len: int) -> int:
    """The answer's max_tokens: the request's; without one, the default, or for an adapted answer
    as many as the memory's longest taught answer needs (a taught reply is not cut at the
    default), within the context."""
    n_ctx = m.engine.config.n_ctx
    if prompt_len + p.max_tokens > n_ctx:
        raise APIError(400, f"prompt ({prompt_len} tokens) + max_tokens ({p.max_tokens}) exceeds the context of "
                       f"{n_ctx} tokens", "context_length_exceeded", "max_tokens")
    if not (p.default_max and adapt):
        return p.max_tokens
    return min(max(p.max_tokens, m.longest_answer + REPLY_MARGIN), n_ctx - prompt_len)


def taught_text(m, pid: int) -> str | None:
    """A prototype's taught answer as a reply reads it (no leading separator, no end newline)."""
    toks = m.bank.answer_tokens()[pid]
    if not len(toks):
        return None
    return strip_lead(m.engine.detokenize([int(t) for t in toks]).rstrip("\n"), m.template.lead)[1]


def newline_end(text: str, answers: list[str]) -> int:
    """Where the newline stop ends ``text`` when a newline inside a taught answer that ``text``
    follows so far is not an end (-1: nowhere). As the engine's rule, a newline before any text
    is no end. Pure: the answer job cuts a reply with it."""
    body = text.lstrip()
    start = len(text) - len(body)
    if not body:
        return -1
    i = text.find(NEWLINE_STOP, start)
    while i >= 0:
        head = text[start:i]
        if not any(a.startswith(head + NEWLINE_STOP) for a in answers):
            return i
        i = text.find(NEWLINE_STOP, i + 1)
    return -1


def _multiline_steering(m, ans, p: GenParams) -> list[str]:
    """The taught multi-line answers a steered reply stopped inside (at an inner newline), if any."""
    if not (p.newline_added and ans.adapted and ans.stop_reason == "stop"):
        return []
    texts = [t for t in (taught_text(m, pid) for pid in ans.prototypes) if t and NEWLINE_STOP in t]
    head = ans.text.lstrip()
    return texts if any(t.startswith(head + NEWLINE_STOP) for t in texts) else []


def answer_job(r, name: str | None, text: str, messages, p: GenParams, on_token=None, gone=None) -> Result:
    """On the worker. ``on_token(choice_index, text_so_far)`` streams; ``messages`` None: a completion;
    ``gone``: a ``threading.Event`` set when the stream's client has left."""
    m = r.memory(name)
    adapt = p.adapt and name is not None
    eng = m.engine
    toks = prompt_for(m, text, messages, adapt)
    budget = reply_budget(m, adapt, p, len(toks))

    def halt():
        if r.closing.is_set():
            return "the server is shutting down", "shutting_down"
        if gone is not None and gone.is_set():
            return "the client went away", "client_gone"
        return None

    choices, first = [], None
    for i in range(p.n):
        def ask(stop, max_tokens, i=i):
            tap = TokenTap(eng, p.top_logprobs, None if on_token is None else (lambda so_far: on_token(i, so_far)),
                           lead=m.template.lead, halt=halt)
            try:
                return tap, m.ask(text, max_tokens=max_tokens, adapt=adapt, stop=stop, temperature=p.temperature,
                                  seed=(p.seed + i) % (1 << 63), top_p=p.top_p, prompt_tokens_override=toks,
                                  on_logits=tap)
            except Stopped:
                eng.reset()  # stopped inside generate: its steering and rows must not reach the next job
                raise

        tap, ans = ask(p.stop, budget)
        n_tokens, finish = tap.n, "length" if ans.stop_reason == "length" else "stop"
        answers = _multiline_steering(m, ans, p)
        if answers:  # the newline stop cut a taught multi-line answer: answer again, ending where it ends
            longest = max(len(eng.tokenize(a, add_bos=False)) for a in answers)
            tap, ans = ask([s for s in p.stop if s != NEWLINE_STOP], min(budget, longest + REPLY_MARGIN))
            cut = newline_end(ans.text, answers)
            if cut >= 0:
                ans.text, ans.stop_reason = ans.text[:cut], "stop"
            n_tokens = min(tap.n, tap.tokens_in(ans.lead + ans.text) + (cut >= 0))
            finish = "length" if ans.stop_reason == "length" else "stop"
        first = first or ans
        choices.append(Choice(ans.text, finish, n_tokens, tap.cut(ans.lead + ans.text)))
    return Result(choices, len(toks), describe(m, name, first, p))


def describe(m, name: str | None, ans, p: GenParams) -> dict:
    """The ``miita`` object: the version used, and what steered the answer (or why nothing did)."""
    ext = {"memory": name, "version": m.version if name else None, "adapted": ans.adapted}
    if p.task is not None:
        ext.update(reason="background_task", task=p.task)
    elif ans.adapted:
        steer = []
        counts = m.bank.counts()  # a view: no Prototype objects made
        for pid, s, w in zip(ans.prototypes, ans.scores, ans.weights):
            steer.append({"prototype": pid, "answer": taught_text(m, pid), "weight": w, "score": s,
                          "count": int(counts[pid])})
        ext.update(steered_by=steer, alphas=ans.alphas, eta=ans.eta)
    elif ans.reason:
        ext["reason"] = ans.reason  # why the memory did not steer (the relevance gate, adapt off, empty)
    return ext
