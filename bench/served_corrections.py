"""Three corrections, each taught once through the server, as an assistant's user would make them.

A chat front end (Open WebUI's Filter, docs/serving.md) teaches each edited answer with one
``POST /v1/memories/NAME/examples``. This makes three such edits in a new, empty memory of a
running ``miita-edge serve`` (one request each), then asks, through ``/v1/chat/completions`` with
the memory's model, each taught question as it was taught, each in other words (two paraphrases),
and nine banking questions that none of the three answers (an untaught request of the same topic is
where a wrong stored answer is most tempting). Each answer is sorted: the right correction, another
correction (a wrong memory), or neither (the frozen model's own text). Written for this check; not a
benchmark's data, and nothing was chosen on it.

    python bench/served_corrections.py --server http://127.0.0.1:8080 --api-key KEY --memory NEWNAME
"""
from __future__ import annotations

import argparse
import json
import sys
import urllib.request

from _report import print_header

CORRECTIONS = [
    ("my parcel never arrived", "Sorry about that! Please write to the shipping desk: shipping@example.com.",
     ["the package I ordered still hasn't been delivered", "my order never showed up at my door"]),
    ("I was charged twice for one order", "Duplicate charges are refunded within 5 days; no need to do anything.",
     ["why did I pay two times for the same purchase?", "there are two identical charges on my card for one order"]),
    ("I forgot my card PIN", "You can reset your PIN in the app under Card > Security > Reset PIN.",
     ["how do I get a new PIN for my card?", "I can't remember the PIN code of my debit card"]),
]
UNTAUGHT = [
    "how do I close my account?", "I was charged a fee I don't understand", "can I change my home address?",
    "what is the daily withdrawal limit?", "my card was swallowed by the ATM", "how long does a bank transfer take?",
    "can I open a joint account?", "is there a fee for paying in euros?", "I want to order a second card",
]


def call(url: str, body=None, key: str = "", method: str | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Authorization": f"Bearer {key}",
                                                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default="http://127.0.0.1:8080")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--memory", required=True, help="a served memory that is new and empty")
    args = ap.parse_args(argv)
    print_header()
    s, key = args.server.rstrip("/"), args.api_key
    info = call(f"{s}/v1/memories/{args.memory}", key=key)
    if info.get("examples", 0):
        print(f"memory {args.memory!r} is not empty ({info['examples']} examples): use a new one", file=sys.stderr)
        return 2
    for q, a, _ in CORRECTIONS:  # one request per correction, as one edit each
        call(f"{s}/v1/memories/{args.memory}/examples?wait=true", [{"input": q, "output": a}], key)
    model = next(m["id"] for m in call(f"{s}/v1/models", key=key)["data"] if m["id"].endswith(f":{args.memory}"))
    answers = [a for _, a, _ in CORRECTIONS]

    def kind(text: str, want: str | None) -> str:
        text = text.strip()
        if want is not None and text.startswith(want):
            return "right"
        return "another correction" if any(text.startswith(a) for a in answers if a != want) else "frozen"

    asks = [(q, a, "as taught") for q, a, _ in CORRECTIONS]
    asks += [(p, a, "paraphrase") for _, a, ps in CORRECTIONS for p in ps]
    asks += [(q, None, "untaught") for q in UNTAUGHT]
    tally: dict[str, dict[str, int]] = {}
    for q, want, group in asks:
        r = call(f"{s}/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": q}],
                                              "temperature": 0}, key)
        text = r["choices"][0]["message"]["content"]
        k = kind(text, want)
        tally.setdefault(group, {}).setdefault(k, 0)
        tally[group][k] += 1
        print(f"{group:10s}  {k:18s}  {q!r} -> {text.strip()[:70]!r}", flush=True)
    for group, counts in tally.items():
        n = sum(counts.values())
        print(f"# {group}: " + ", ".join(f"{k} {v}/{n}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
