"""Does memory steering *work* on a model? The functional half of ``miita-edge check-model``.

The mechanical self-test (runtime/support.py) proves that the callback reads the right tensors and
that an addition moves the logits by exactly c·W·δ. That says nothing about whether the method's
directions, keys and gate give answers on that model: a head with anisotropic rows passed every
mechanical item while its memory answered garbage. So this check teaches a small synthetic memory
and asks it, as a user would:

- **recall**: every taught input asked verbatim must return its taught answer exactly;
- **untouched**: unrelated questions must get exactly the frozen model's answer (the gate closes).

Answers are pairs of ordinary English words drawn with a fixed seed, each taught by two phrasings
(so it recurs, as the relevance gate asks); the unrelated questions are general knowledge and small
talk. Nothing here is tuned on a benchmark, and the bar (both rates >= 95%) is fixed.
"""
from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass, field

import numpy as np

from .miita import Miita
from .runtime.engine import Engine
from .streams import Example

__all__ = ["BAR", "SteeringCheck", "steering_check", "synthetic_pairs", "UNRELATED"]

#: Both rates must reach this for "supported".
BAR = 0.95
#: Below this recall the memory is useless on the model: "refused".
REFUSE_BELOW = 0.5

_WORDS = ("apple river stone garden yellow window music paper silver forest ocean candle mirror bridge pencil "
          "winter summer orange basket ladder rocket guitar planet island valley castle jacket kettle lemon "
          "marble needle pepper rabbit saddle tiger violet wagon blanket button carpet cherry cotton dragon "
          "feather hammer helmet honey lantern meadow mountain pillow puzzle ribbon shadow spider sugar "
          "thunder tomato turtle velvet whistle").split()
_THINGS = ("printer laptop bicycle heater kettle camera phone fridge oven router tablet scooter watch speaker "
           "blender lamp toaster monitor keyboard charger dishwasher projector microwave doorbell").split()
_PROBLEMS = [("keeps beeping at night", "makes a beeping noise every night"),
             ("will not turn on", "does not switch on anymore"),
             ("is making a strange smell", "smells odd when I use it"),
             ("stopped working after the update", "broke after I updated it")]

#: Questions no synthetic answer fits (small talk and general knowledge).
UNRELATED = [
    "What is the capital of France?", "How many legs does a spider have?", "Who wrote Hamlet?",
    "Tell me a joke about cats.", "How are you today?", "What is the boiling point of water?",
    "Why is the sky blue?", "What is seven plus five?", "Name a primary colour.",
    "What is the largest planet?", "How do I make a cup of tea?", "What do bees make?",
    "Who painted the Mona Lisa?", "What language is spoken in Brazil?", "How many days are in a week?",
    "What is the opposite of hot?", "Good morning! Any plans for today?", "What do cows drink?",
    "How many continents are there?", "What is the chemical symbol for water?",
    "Write a short poem about rain.", "Which animal is the fastest?", "What is the moon made of?",
    "How do airplanes fly?", "What is the tallest mountain?", "What time is it in Tokyo now?",
    "Can you recommend a good film?", "What is the square root of nine?", "Where do penguins live?",
    "What is the currency of Japan?", "Thanks, that was helpful!", "What colour are bananas?",
]


@dataclass
class SteeringCheck:
    """The rates and a few failures, for one preset."""

    preset: str
    recall: float
    untouched: float
    n_taught: int
    n_unrelated: int
    failures: list = field(default_factory=list)  # up to 4 (question, expected, got)

    @property
    def verdict(self) -> str:
        """"supported", "limited" or "refused", by the fixed bar."""
        if self.recall < REFUSE_BELOW:
            return "refused"
        return "supported" if self.recall >= BAR and self.untouched >= BAR else "limited"

    def reason(self) -> str:
        """One line saying what the rates mean ("" when supported)."""
        if self.verdict == "supported":
            return ""
        if self.recall < BAR:
            return (f"steering does not reproduce taught answers on this model ({100 * self.recall:.0f}% of "
                    f"{self.n_taught} taught inputs asked verbatim; {100 * self.untouched:.0f}% of unrelated "
                    f"questions untouched; preset {self.preset})")
        return (f"steering changes answers to unrelated questions on this model ({100 * (1 - self.untouched):.0f}% "
                f"of {self.n_unrelated}; taught answers {100 * self.recall:.0f}%; preset {self.preset})")

    def to_json(self) -> dict:
        out = asdict(self)
        out["verdict"] = self.verdict
        return out


def synthetic_pairs(n_answers: int = 24, seed: int = 0) -> list[Example]:
    """``2·n_answers`` examples: each answer (two ordinary words) taught by two phrasings of one
    complaint about one household thing."""
    rng = np.random.default_rng(seed)
    combos = [(t, p) for t in _THINGS for p in _PROBLEMS]
    picks = rng.permutation(len(combos))[:n_answers]
    out: list[Example] = []
    for i, c in enumerate(picks):
        thing, (a, b) = combos[int(c)]
        answer = " ".join(rng.choice(_WORDS, size=2, replace=False))
        out.append(Example(f"my {thing} {a}", answer, None, 2 * i + 1))
        out.append(Example(f"the {thing} I own {b}", answer, None, 2 * i + 2))
    return out


def steering_check(model=None, preset: str = "default", engine: Engine | None = None, n_answers: int = 24,
                   seed: int = 0, max_tokens: int = 8) -> SteeringCheck:
    """Teach ``synthetic_pairs`` to a fresh memory with ``preset`` (the default template: the model's
    chat template where it has one, else ``plain``), then measure
    recall of the taught inputs and the untouched share of ``UNRELATED``."""
    pairs = synthetic_pairs(n_answers, seed)
    failures: list = []
    with tempfile.TemporaryDirectory(prefix="miita-check-") as tmp, \
            Miita(model, tmp, preset=preset, engine=engine) as m:  # the template users get
        m.ingest(pairs, budget="none")
        hits = 0
        for ex in pairs:
            got = m.ask(ex.input, max_tokens=max_tokens).text.strip()
            hits += got == ex.output
            if got != ex.output and len(failures) < 4:
                failures.append((ex.input, ex.output, got))
        same = 0
        for q in UNRELATED:
            frozen = m.ask(q, max_tokens=max_tokens, adapt=False).text
            adapted = m.ask(q, max_tokens=max_tokens).text
            same += frozen == adapted
            if frozen != adapted and len(failures) < 8:
                failures.append((q, frozen.strip(), adapted.strip()))
    return SteeringCheck(preset, hits / len(pairs), same / len(UNRELATED), len(pairs), len(UNRELATED), failures)
