"""Two methods that change only the prompt: the frozen model told the stage's label set, and
SummaryMem, the paper's text-summary memory (appendix C.2).

Why ``frozen-labels``: accuracy is exact match on the label, and the benchmark templates never
list the labels, so the frozen model scores near 0 on Banking77 and DSC whatever it understands.
Against that baseline, FWT mixes "learned the answer format" with "learned the task"; against the
frozen model told the labels it measures the task alone.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from ..errors import BudgetError, InputError
from ..streams import Example
from .methods import Method, generate_text

__all__ = ["FrozenLabels", "SummaryMem", "cut_utf8", "labels_header"]


def labels_header(labels: list[str]) -> str:
    """The line ``frozen-labels`` puts before the template's prompt."""
    return "Possible answers: " + ", ".join(labels) + "\n"


def _tokens(ctx, text: str) -> list[int]:
    from ..method.extract import truncate_tokens

    return truncate_tokens(ctx.engine.tokenize(text), ctx.max_prompt_tokens)


class FrozenLabels(Method):
    """The model alone, its prompt headed by the query's stage's label set (meta.json
    ``labels_per_stage``, verbalised as the outputs are); greedy, no memory. Classification only:
    the other benchmarks have no label set."""

    learns = False
    stores = False
    classification_only = True

    def predict(self, examples):
        c = self.ctx
        out = []
        for ex in examples:
            labels = c.stage_labels(ex.task)
            if labels is None:
                raise InputError(f"frozen-labels: meta.json gives no label set for stage {ex.task!r}")
            toks = _tokens(c, labels_header(labels) + c.template.render_prompt(ex.input))
            out.append(generate_text(c.engine, toks, c.max_tokens))
        return out


def cut_utf8(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, at a word boundary where there is one."""
    b = text.encode("utf-8")
    if len(b) <= limit:
        return text
    s = b[:max(limit, 0)].decode("utf-8", errors="ignore")
    if b[len(s.encode("utf-8")):][:1] == b" ":  # the cut falls at the end of a word
        return s.rstrip()
    cut = s.rfind(" ")
    return (s[:cut] if cut > 0 else s).rstrip()


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


class SummaryMem(Method):
    """A running text summary per stage, written by the model itself, placed in the prompt.

    * Write: a stage's examples are read in chunks of ``CHUNK``; after each chunk the model
      continues, greedily, "Notes so far: ... More examples (input => answer): ... Updated notes,
      one line: the answers are" (inputs cut to ``INPUT_WORDS`` words; a completion prompt,
      since the bundled model follows no chat format here). Its first line with a word character
      becomes the stage's notes, cut to the stage's allowance: the budget divided by the number
      of stages in the stream (``SUMMARY_BYTES`` per stage without a budget). Stored bytes: the
      notes' UTF-8.
    * Use: the ``TOP`` stages' notes sharing the most words with the query (ties: newer first), put
      before the template's prompt as ``Notes: ...`` lines, most similar next to the query.
    """

    CHUNK, INPUT_WORDS, TOP, SUMMARY_BYTES, NOTE_TOKENS = 8, 40, 2, 1024, 96
    FILE = "summaries.json"

    def setup(self, ctx):
        super().setup(ctx)
        self.reset()

    def reset(self):
        self.notes: dict[str, str] = {}  # stage -> notes, in learning order

    def allowance(self) -> int:
        b, n = self.ctx.budget_bytes, max(int(self.ctx.n_stages), 1)
        return self.SUMMARY_BYTES if b is None else b // n

    def memory_bytes(self) -> int:
        return sum(len(v.encode("utf-8")) for v in self.notes.values())

    def summary_prompt(self, notes: str, chunk: list[Example]) -> str:
        from ..method.templates import truncate_words

        lines = [f"{truncate_words(' '.join(ex.input.split()), self.INPUT_WORDS)} => {ex.output.strip()}"
                 for ex in chunk]
        return (f"Notes so far: {notes or '(none)'}\n\nMore examples (input => answer):\n" + "\n".join(lines) +
                "\n\nUpdated notes, one line: the answers are")

    def learn(self, stage_examples):
        if not stage_examples:
            return
        stage, c = stage_examples[0].task, self.ctx
        limit = self.allowance()
        if limit < 1:
            raise BudgetError(f"summary-mem: a budget of {c.budget_bytes} bytes leaves no byte per stage")
        notes = ""
        for i in range(0, len(stage_examples), self.CHUNK):
            toks = c.engine.tokenize(self.summary_prompt(notes, stage_examples[i:i + self.CHUNK]))
            if len(toks) + self.NOTE_TOKENS + 1 > c.engine.config.n_ctx:
                continue  # a chunk that cannot fit the context is skipped, not cut mid-example
            text = c.engine.generate(c.engine.query(toks), max_tokens=self.NOTE_TOKENS, stop=("\n\n",)).text
            line = next((ln for ln in text.splitlines() if re.search(r"\w", ln)), "")
            notes = cut_utf8("the answers are " + " ".join(line.strip(" :").split()), limit)
        self.notes[stage] = notes

    def retrieve(self, x: str) -> list[str]:
        """The notes to show for query ``x``, least similar first."""
        q = _words(x)
        ranked = sorted(enumerate(self.notes.values()), key=lambda p: (-len(q & _words(p[1])), -p[0]))
        return [v for _, v in ranked[:self.TOP] if v][::-1]

    def prompt(self, x: str) -> str:
        notes = "".join(f"Notes: {v}\n" for v in self.retrieve(x))
        return notes + self.ctx.template.render_prompt(x)

    def predict(self, examples):
        c = self.ctx
        return [generate_text(c.engine, _tokens(c, self.prompt(ex.input)), c.max_tokens) for ex in examples]

    def save(self, dst):
        dst.mkdir(parents=True)
        (dst / self.FILE).write_text(json.dumps(self.notes, ensure_ascii=False), "utf-8")

    def load(self, src):
        notes = json.loads((Path(src) / self.FILE).read_text("utf-8"))
        if not isinstance(notes, dict) or not all(isinstance(v, str) for v in notes.values()):
            raise InputError(f"{src}: summary-mem notes must map stage names to text")
        self.notes = dict(notes)
