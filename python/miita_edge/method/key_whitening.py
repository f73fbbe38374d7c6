"""Keys whitened against paraphrase noise: two phrasings of one request brought nearer.

Why: a key is a pooled hidden state, and most of what tells two phrasings of one request apart is
shared across requests: word order, length, politeness, a question against a statement. Those
directions carry much of a key's variance, so a query's nearest stored examples are often
another request phrased alike. Measured on the model, over groups of phrasings written for this
purpose and unrelated to any benchmark (``GROUPS``: everyday requests, three or four phrasings
each), the within-group scatter W estimates that noise; the key is multiplied by
W_s^(-1/2), W_s = (1 - s)·W + s·tr(W)/n·I, before its sign bits are taken, so the noise
directions count less in the cosine and the directions that tell requests apart count more.

Like the centring vector (method/calibration.py) it depends only on the model, the template and
the key settings, never on what a memory learns: derived again when a memory opens, cached in the
user cache directory, not stored and not counted in the memory's byte budget. A memory's stored
bits stay valid as it grows, which a scatter fitted on the memory's own examples would not allow.

The math is pure numpy (``prepared``, ``within_scatter``, ``whitening_matrix``), tested against a
plain re-derivation; ``paraphrase_keys`` does the model passes.
"""
from __future__ import annotations

import numpy as np

from ..runtime.engine import Engine
from ..runtime.fingerprint import cache_dir, cached_matrix
from .calibration import cached_raw_keys
from .key_layers import PARAPHRASES
from .templates import Template

__all__ = ["GROUPS", "REPLY_MIN_TOKENS", "SHRINK", "cached_whitening_for", "paraphrase_keys", "whiten_replies",
           "prepared", "whitening_for", "whitening_matrix", "within_scatter"]

#: An answer of at least this many tokens is a reply, a shorter one a label or a short span. Fixed
#: by construction, not measured: Banking77's longest label is 10 tokens, its canned replies 25-36,
#: so 16 keeps every label out and lets every reply in (DSC's labels are 2 tokens).
REPLY_MIN_TOKENS = 16

#: The shrinkage s toward the identity: the best mean sign-bit vote of 0.1 / 0.3 / 0.6 on
#: Banking77's dev rows over both models (bench/whitening.py; docs/method.md, "Whitening, for a memory of replies").
SHRINK = 0.3

#: More everyday requests, four phrasings each, written for the whitening (no benchmark's intents).
MORE_PARAPHRASES = [
    ["how do I reset my router", "my router needs a restart, how", "what is the way to reboot the wifi box",
     "steps to restart the internet router"],
    ["the train is delayed again", "my train is running late", "why is the train not on time",
     "there is a delay on my train line"],
    ["I need to change my address", "I moved and want to update my address", "how do I give you my new home address",
     "please update where I live"],
    ["can I return these shoes", "I want to send back the shoes I bought", "how do returns work for shoes",
     "the shoes do not fit, can I return them"],
    ["what time does the pharmacy close", "until when is the pharmacy open", "when does the chemist shut tonight",
     "is the pharmacy still open this evening"],
    ["my laptop will not turn on", "the computer does not start anymore", "pressing the power button on my laptop does nothing",
     "my notebook stays black when I switch it on"],
    ["I want to learn spanish", "how do I start learning spanish", "what is a good way to pick up spanish",
     "help me study the spanish language"],
    ["my order has not arrived yet", "the parcel I ordered is still not here", "where is my delivery, it is late",
     "I am still waiting for my order"],
    ["how do I make bread at home", "a simple recipe for homemade bread", "I want to bake my own bread",
     "what do I need to bake a loaf"],
    ["my tooth hurts when I eat", "I have pain in a tooth while chewing", "eating makes my tooth ache",
     "there is a sharp pain in my tooth at meals"],
    ["the printer is out of ink", "my printer says the cartridge is empty", "no ink left in the printer",
     "the printer needs a new ink cartridge"],
    ["I would like to rent a car", "can I hire a car for the weekend", "how do I book a rental car",
     "I need a car rental for three days"],
    ["my kid has a fever", "my son is running a high temperature", "my daughter feels hot and sick",
     "the child has a temperature, what should I do"],
    ["how do I unsubscribe from these emails", "stop sending me newsletters", "I want off your mailing list",
     "how can I opt out of the emails"],
    ["the elevator in my building is broken", "the lift is not working", "our building's elevator is out of order",
     "the lift has been stuck for days"],
    ["what should I pack for a beach holiday", "packing list for a trip to the seaside", "what do I bring on a beach vacation",
     "help me pack for the beach"],
    ["my back hurts after sitting all day", "long hours at my desk give me back pain", "sitting at work makes my back ache",
     "my lower back is sore from the office chair"],
    ["how do I update my phone", "my phone needs a software update, how", "where do I install the latest system update",
     "how can I upgrade the phone's operating system"],
    ["I locked myself out of my house", "my keys are inside and the door is shut", "I cannot get into my home, no key",
     "the door closed with my keys inside"],
    ["is it going to rain tomorrow", "will there be rain tomorrow", "what is the forecast for tomorrow, any rain",
     "should I take an umbrella tomorrow"],
    ["my coffee machine leaks water", "water drips out of the coffee maker", "the espresso machine is leaking",
     "there is a puddle under my coffee machine"],
    ["how do I write a cover letter", "tips for a good job application letter", "help me draft a cover letter",
     "what goes into a motivation letter for a job"],
    ["the hotel room is dirty", "my hotel room was not cleaned", "the room I was given is filthy",
     "the sheets in my hotel room are stained"],
    ["I cannot sleep at night", "I lie awake for hours every night", "falling asleep is so hard for me",
     "I have trouble sleeping lately"],
    ["how long does shipping take", "when will the item be delivered", "how many days until it arrives",
     "what is the delivery time"],
    ["my bike has a flat tyre", "the tire on my bicycle is flat", "I need to fix a puncture on my bike",
     "my bicycle wheel lost its air"],
    ["I want to cancel my appointment", "please call off my appointment", "I cannot make it to my appointment, cancel it",
     "remove my booking for tomorrow"],
    ["the fridge is making a loud noise", "my refrigerator hums very loudly", "a strange buzzing comes from the fridge",
     "the fridge got noisy suddenly"],
    ["what documents do I need for a visa", "which papers are required for a visa application",
     "what should I bring to apply for a visa", "the visa needs which documents"],
    ["my account was hacked", "someone broke into my account", "I think a stranger logged into my profile",
     "my login was used by somebody else"],
    ["how do I get rid of ants in the kitchen", "there are ants all over my kitchen", "ants keep coming into the kitchen, help",
     "how can I stop ants in my kitchen"],
    ["the app keeps crashing", "the application closes by itself", "every time I open the app it crashes",
     "the app shuts down on its own"],
    ["can I change my seat on the plane", "I want a different seat on my flight", "how do I pick another seat for the flight",
     "is it possible to switch my airplane seat"],
    ["my neighbour's tree hangs over my garden", "branches from next door cover my yard",
     "the tree next door grows into my garden", "my neighbour's tree blocks my garden"],
    ["how many calories should I eat a day", "what is a healthy daily calorie intake",
     "how much food energy do I need each day", "the right number of calories per day"],
    ["the concert tickets are sold out", "there are no tickets left for the show",
     "I could not get tickets, the concert is full", "the gig sold out before I could buy"],
    ["my headphones only play on one side", "sound comes out of just one earbud", "the left side of my headphones is silent",
     "only one ear of my headset works"],
    ["how do I file a complaint", "where can I complain about the service", "I want to make a formal complaint",
     "what is the process to lodge a complaint"],
    ["I spilled wine on the carpet", "red wine got on my rug", "how do I clean a wine stain from the carpet",
     "there is a wine spot on the floor rug"],
    ["what is the best time to visit Japan", "when should I travel to Japan", "which season is good for a trip to Japan",
     "the ideal month to go to Japan"],
]

#: Every group the scatter is measured on: the key layers' criterion's twenty, then the forty above.
GROUPS = PARAPHRASES + MORE_PARAPHRASES
VERSION = 1  # of GROUPS and the cache file


def prepared(raw: np.ndarray, mean: np.ndarray | None, parts: int) -> np.ndarray:
    """Raw keys (N, parts·H) as a memory compares them before whitening: centred on ``mean``, each
    layer's block at unit norm (float64)."""
    x = np.asarray(raw, np.float64)
    if mean is not None:
        x = x - np.asarray(mean, np.float64)
    blocks = x.reshape(len(x), parts, -1)
    blocks = blocks / np.maximum(np.linalg.norm(blocks, axis=2, keepdims=True), 1e-12)
    return blocks.reshape(len(x), -1)


def within_scatter(z: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """(1/N)·Σ_i (z_i - m_g(i))(z_i - m_g(i))ᵀ, m_g the mean of group g: the paraphrase noise."""
    z = np.asarray(z, np.float64)
    groups = np.asarray(groups)
    centred = z.copy()
    for g in np.unique(groups):
        sel = groups == g
        centred[sel] -= z[sel].mean(axis=0)
    return centred.T @ centred / len(z)


def whitening_matrix(W: np.ndarray, shrink: float = SHRINK) -> np.ndarray:
    """W_s^(-1/2) for W_s = (1 - s)·W + s·(tr W / n)·I: symmetric, so it whitens rows (z @ M) and
    columns alike. Scaled to unit mean eigenvalue, which neither a sign bit nor a cosine sees."""
    if not 0.0 < shrink <= 1.0:
        raise ValueError(f"shrink {shrink!r} is outside (0, 1]")
    W = np.asarray(W, np.float64)
    n = W.shape[0]
    Ws = (1.0 - shrink) * W + shrink * (np.trace(W) / n) * np.eye(n)
    e, V = np.linalg.eigh(Ws)
    M = (V / np.sqrt(e)) @ V.T
    return M / (np.trace(M) / n)


def paraphrase_keys(engine: Engine, template: Template, skip_bos: bool, fingerprint: dict) -> np.ndarray:
    """The raw keys of every phrasing in ``GROUPS`` through ``template`` (float32, (N, L·H)),
    cached per (model sha256, template, key layers, their pooling, BOS rule) like the calibration keys."""
    layers = fingerprint.get("key_layers") or [fingerprint["key_layer"]]
    tag = (f"{fingerprint['sha256'][:16]}-{template.name}-L{'_'.join(map(str, layers))}-bos{int(not skip_bos)}"
           f"-P{'_'.join(engine.key_pooling)}-v{VERSION}")
    texts = [t for g in GROUPS for t in g]
    return cached_raw_keys(engine, template, skip_bos, texts, cache_dir() / f"paraphrase-keys-{tag}.npy")


def group_ids() -> np.ndarray:
    """(N,) the group of each phrasing, in ``paraphrase_keys``' order."""
    return np.array([i for i, g in enumerate(GROUPS) for _ in g])


def whitening_for(raw_paraphrases: np.ndarray, mean: np.ndarray | None, parts: int,
                  shrink: float = SHRINK, groups: np.ndarray | None = None) -> np.ndarray:
    """The whitening matrix (float32, (L·H, L·H)) from the paraphrases' raw keys (``groups``: their
    groups, default ``group_ids()``, every phrasing of ``GROUPS``)."""
    z = prepared(raw_paraphrases, mean, parts)
    return whitening_matrix(within_scatter(z, group_ids() if groups is None else groups), shrink).astype(np.float32)


def cached_whitening_for(raw_paraphrases: np.ndarray, mean: np.ndarray | None, parts: int,
                         shrink: float = SHRINK, groups: np.ndarray | None = None) -> np.ndarray:
    """``whitening_for``, read from the user cache directory when it was computed before
    (``groups``: as there; a subset of the groups, such as a fold of the held-out reach, is a
    matrix of its own).

    Why: the eigendecomposition of an (L·H)² scatter takes most of a second on one core (1,280
    values wide on Gemma-3-270M), and a memory derives its whitening every time it opens (each
    ``miita-edge ask``). The file is named by a hash of everything the matrix depends on (the
    raw keys, the centring vector, the block count, the shrinkage), so a changed input never
    reads a stale matrix."""
    raw = np.ascontiguousarray(raw_paraphrases, np.float32)
    m = None if mean is None else np.asarray(mean, np.float32)
    inputs = [raw, m, f"{parts}|{float(shrink)!r}|{raw.shape}|v{VERSION}"]
    if groups is not None:
        inputs.append(np.ascontiguousarray(groups, np.int64))
    return cached_matrix(cache_dir(), "whitening", inputs, raw.shape[1],
                         lambda: whitening_for(raw, mean, parts, shrink, groups=groups))


def whiten_replies(answer_tokens: list[int], min_tokens: int = REPLY_MIN_TOKENS) -> bool | None:
    """Whether a memory of preset ``key_whitening = "replies"`` whitens its keys, from the token
    counts of the answers its first ingest teaches: True when their median is at least
    ``min_tokens`` (replies, ``REPLY_MIN_TOKENS``), False when below (labels, short spans), None
    without any answer (the decision waits for an ingest that teaches one).

    Why by the answers: whitening weighs down how a thing is said in favour of what is asked. A
    canned reply is chosen by what is asked, and whitening finds it more often; a label such as a
    review's sentiment is partly how the thing is said, and whitening lost it (docs/method.md, "Whitening, for a
    memory of replies").
    Decided once, while the memory is empty, because stored sign bits cannot be re-whitened later."""
    if not answer_tokens:
        return None
    return bool(np.median(np.asarray(answer_tokens, np.float64)) >= min_tokens)
