"""The research claim end to end, on the real model: a memory of supervised
examples makes the frozen Gemma-3-270M answer a task it cannot guess.

The task maps three clearly different topics to arbitrary labels (cooking ->
"zebra code", car trouble -> "lime code", astronomy -> "ocean code"); no model
can know these labels without the examples. 12 training and 9 held-out
queries per label, all written here. Accuracy is exact equality of normalised
labels (normaliser written here, not the package's).
"""
from __future__ import annotations

import os

import pytest

from miita_edge.runtime.engine import EngineConfig
from miita_edge.miita import Miita
from miita_edge.streams import Example

pytestmark = pytest.mark.model

ENGINE = EngineConfig(n_threads=1)  # robust on a busy 2-core box
N_TRAIN = 12

COOKING = [
    'How long should I simmer tomato sauce for pasta?',
    'What is the best way to caramelise onions in a pan?',
    'Can I replace butter with olive oil when baking bread?',
    'My risotto always turns out gluey, what am I doing wrong?',
    'How do I keep pancakes fluffy instead of flat?',
    'Which spices go well in a slow cooked lentil soup?',
    'Should I salt the water before boiling potatoes?',
    'How hot should the oven be for roasting a whole chicken?',
    'Why does my homemade mayonnaise split when I whisk it?',
    'What knife is best for chopping garlic and herbs finely?',
    'How do I stop rice from sticking to the bottom of the pot?',
    'Is it safe to marinate fish in lemon juice overnight?',
    'How many eggs do I need for a sponge cake recipe?',
    'What is the trick to a crispy skin on roast pork belly?',
    'Can I freeze leftover vegetable stew for next week?',
    'How do I thicken a curry sauce without flour?',
    'Why did my bread dough not rise in the warm kitchen?',
    'What temperature should I fry chips at in a deep fryer?',
    'How finely should I dice carrots for a stir fry?',
    'Which cheese melts best on top of a lasagne?',
    'How do I know when a steak is medium rare on the grill?',
]
CARS = [
    'My car makes a grinding noise when I press the brake pedal.',
    'The engine warning light came on after I filled the tank.',
    'How often should I change the oil in a diesel hatchback?',
    'The car battery keeps going flat overnight in winter.',
    'Steering wheel shakes at motorway speed, what could cause it?',
    'Coolant is leaking under the front bumper of my sedan.',
    'The gearbox crunches when shifting from first to second gear.',
    'My tyres wear out faster on the inside edge than outside.',
    'The exhaust is blowing blue smoke when the engine starts.',
    'Windscreen wipers stopped working halfway through a drive.',
    'What tyre pressure should I use for a loaded estate car?',
    'The clutch pedal feels spongy and sticks to the floor.',
    'My car will not start and just clicks when I turn the key.',
    'The air conditioning in my car blows only warm air.',
    'There is a squeal from the engine belt on cold mornings.',
    'Headlights flicker whenever I switch on the radio in the car.',
    'The fuel economy of my petrol car suddenly dropped.',
    'My car pulls to the left when I let go of the wheel.',
    'Which spark plugs fit a four cylinder petrol engine?',
    'The handbrake does not hold the car on a steep hill.',
    'A rattling sound comes from under the car over bumps.',
]
SPACE = [
    'How far away is the Andromeda galaxy from the Milky Way?',
    'Why does Mars look red when seen through a telescope?',
    'What causes a total eclipse of the Sun?',
    'How many moons does Jupiter have in its orbit?',
    'What is a neutron star made of?',
    'How long does light take to travel from the Sun to Earth?',
    'Why do comets grow a tail as they approach the Sun?',
    'What is the difference between a meteor and a meteorite?',
    'How do astronomers find planets around distant stars?',
    'Why is Venus the hottest planet in the solar system?',
    'What happens at the event horizon of a black hole?',
    'When is the best night to watch the Perseid meteor shower?',
    'How big is the Great Red Spot on Jupiter?',
    'Why does the Moon always show the same face to Earth?',
    'What are the rings of Saturn made of?',
    'How old is the universe according to the cosmic background?',
    'What is a light year used to measure in astronomy?',
    'Why do stars twinkle but planets mostly do not?',
    'How hot is the surface of the Sun in degrees?',
    'What is a supernova and when does it happen?',
    'Which constellation contains the North Star Polaris?',
]


LABELS = {"zebra code": COOKING, "lime code": CARS, "ocean code": SPACE}


def split() -> tuple[list[Example], list[Example]]:
    """Train rows interleaved by label (a stream, not three blocks); held-out rows after them."""
    train, test = [], []
    for i in range(N_TRAIN):
        for label, queries in LABELS.items():
            train.append(Example(queries[i], label, None, len(train) + 1))
    for label, queries in LABELS.items():
        test += [Example(q, label) for q in queries[N_TRAIN:]]
    return train, test


def norm(text: str) -> str:
    """First non-blank line, lower-case, whitespace collapsed, trailing full stop dropped."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    return " ".join(line.lower().split()).rstrip(".").strip()


def version_bytes(mem) -> int:
    """Size of the version file that CURRENT names (one file per version since store format 2)."""
    with open(os.path.join(mem, "CURRENT")) as fh:
        vfile = os.path.join(mem, fh.read().strip())
    assert os.path.isfile(vfile)
    return os.path.getsize(vfile)


def test_data_is_what_the_test_claims():
    train, test = split()
    assert len(train) == 3 * N_TRAIN and len(test) == 27
    assert not {e.input for e in train} & {e.input for e in test}  # held out means unseen
    assert len({e.input for e in train + test}) == len(train + test)


def test_memory_answers_more_held_out_queries_than_the_frozen_model(tmp_path):
    train, test = split()
    mem = tmp_path / "mem"
    with Miita(memory=mem, template="plain", engine_config=ENGINE) as m:
        rep = m.ingest(train)
        assert rep.examples == len(train) and rep.skipped == 0
        assert rep.bytes == version_bytes(mem) <= rep.budget_bytes
        frozen = [m.ask(e.input, max_tokens=8, adapt=False).text for e in test]
        adapted = [m.ask(e.input, max_tokens=8).text for e in test]
    n_frozen = sum(norm(a) == e.output for a, e in zip(frozen, test))
    n_adapted = sum(norm(a) == e.output for a, e in zip(adapted, test))
    print(f"\ndefault preset: frozen {n_frozen}/{len(test)}, with memory {n_adapted}/{len(test)} "
          f"({rep.prototypes} prototypes, {rep.anchors} anchors, {rep.bytes} bytes)")
    assert n_adapted > n_frozen, list(zip([e.output for e in test], frozen, adapted))
    # replies come as users read them: the plain template's " " after "Answer:" is not part of them
    hits = [a for a, e in zip(adapted, test) if norm(a) == e.output]
    assert hits and all(a == a.lstrip(" ") for a in hits), hits

    # The memory lives on disk: a fresh process-level open answers the same way.
    with Miita(memory=mem, engine_config=ENGINE) as m2:
        assert m2.examples == len(train)
        again = [m2.ask(e.input, max_tokens=8).text for e in test[::9]]
    assert again == adapted[::9]


def test_paper_preset_runs_end_to_end_within_a_binding_budget(tmp_path):
    train, test = split()
    mem = tmp_path / "mem"
    budget = 12 * 1024  # below what the paper preset keeps for this stream unconstrained (~16.5 KiB)
    with Miita(memory=mem, preset="paper", template="plain", engine_config=ENGINE) as m:
        rep = m.ingest(train, budget="12KiB")
        answers = [m.ask(e.input, max_tokens=8) for e in test]
    assert rep.budget_bytes == budget
    assert sum(rep.repair.values()) > 0  # the budget really had to be enforced
    assert rep.bytes == version_bytes(mem) <= budget
    assert all(isinstance(a.text, str) for a in answers)
    n = sum(norm(a.text) == e.output for a, e in zip(answers, test))
    print(f"\npaper preset (12KiB): with memory {n}/{len(test)} "
          f"({rep.prototypes} prototypes, {rep.anchors} anchors, {rep.bytes} bytes, repair {rep.repair})")


def test_a_miita_that_builds_its_engine_answers_past_a_leading_blank_line(tmp_path):
    """The bundled Gemma opens its greedy reply to this query with a newline. Miita without an
    engine_config ends an answer at a newline only after text, the rule of ask, demo and serve;
    a config that is passed is used as it is, so the stop-anywhere rule answers ""."""
    q = "My card was charged twice for one purchase."
    with Miita(memory=tmp_path / "a") as m:
        assert m.engine.config.stop_after_text
        ans = m.ask(q, max_tokens=12, adapt=False)
    assert ans.text.startswith("\n") and ans.text.strip(), ans.text
    with Miita(memory=tmp_path / "b", engine_config=ENGINE) as m:
        assert m.ask(q, max_tokens=12, adapt=False).text == ""
