"""The server's overhead, measured in one run (issue 12): prints ratios only, since the machines
this runs on are noisy.

1. served answer wall time (non-streamed chat, over HTTP through the ``openai`` client) against
   ``Miita.ask`` in process, for the same 32-token answer (stop disabled; target <= 1.10);
2. time to the first streamed token against the non-streamed wall time;
3. requests/s with 1 and with 4 concurrent clients (the server answers one at a time).

A/B rounds alternate (in process, served); medians. The server runs as a subprocess with the
same --threads; the in-process model sits idle while the server works.

    python bench/serve.py [--threads 2] [--rounds 7] [--requests 16] [--seed 0]
Exits 1 if the served/in-process ratio is above --target (default 1.10).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--requests", type=int, default=16, help="requests per client count for requests/s")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--target", type=float, default=1.10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import openai

    from miita_edge import Example, Miita
    from miita_edge.runtime.engine import EngineConfig

    rows = [json.loads(x) for x in (Path(__import__("miita_edge").__file__).parent / "demo" / "stream.jsonl")
            .read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"][:40]
    query = [r for r in rows if r["split"] == "test"][args.seed % 80]["input"]
    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    mem = tmp / "mem"
    cfg = EngineConfig(n_threads=args.threads, n_ctx=1024)
    m = Miita(memory=mem, engine_config=cfg)
    m.ingest([Example(r["input"], r["output"]) for r in train])

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__import__("miita_edge").__file__).resolve().parent.parent)] + [os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "miita_edge.cli", "serve", "--memory", f"mem={mem}", "--port",
                             str(port), "--threads", str(args.threads), "--ctx", "1024"], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(tmp / "server.log", "wb"))
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url + "/v1/models", timeout=2)
            break
        except OSError:
            time.sleep(0.2)
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    msgs = [{"role": "user", "content": query}]
    kw = dict(model="mem", messages=msgs, max_tokens=args.tokens, stop=[], temperature=0)

    try:
        local_t, served_t, ttft_t, n_tok = [], [], [], None
        client.chat.completions.create(**kw)  # warm both
        m.ask(query, max_tokens=args.tokens, stop=())
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            a = m.ask(query, max_tokens=args.tokens, stop=())
            local_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            r = client.chat.completions.create(**kw)
            served_t.append(time.perf_counter() - t0)
            assert r.choices[0].message.content == a.text, (r.choices[0].message.content, a.text)
            n_tok = r.usage.completion_tokens
            t0 = time.perf_counter()
            first = None
            for ch in client.chat.completions.create(**kw, stream=True):
                if first is None and ch.choices and ch.choices[0].delta.content:
                    first = time.perf_counter() - t0
            ttft_t.append(first)

        def rps(n_clients: int) -> float:
            per = max(1, args.requests // n_clients)
            small = dict(kw, max_tokens=8)

            def work():
                c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
                for _ in range(per):
                    c.chat.completions.create(**small)
            ts = [threading.Thread(target=work) for _ in range(n_clients)]
            t0 = time.perf_counter()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            return per * n_clients / (time.perf_counter() - t0)

        r1, r4 = rps(1), rps(4)
    finally:
        proc.terminate()
        proc.wait(20)
        m.close()
    lm, sm, tm = statistics.median(local_t), statistics.median(served_t), statistics.median(ttft_t)
    ratio = sm / lm
    print(f"command: python bench/serve.py {shlex.join(sys.argv[1:])}")
    print(f"answer: {n_tok} tokens, adapted, memory of {len(train)} demo rows, --threads {args.threads}, "
          f"{args.rounds} rounds (medians)")
    print(f"Miita.ask in process      {lm * 1000:8.1f} ms")
    print(f"served (HTTP, openai)     {sm * 1000:8.1f} ms   ratio served/in-process {ratio:.3f} "
          f"(target <= {args.target:.2f})")
    print(f"first streamed token      {tm * 1000:8.1f} ms   ratio TTFT/non-streamed {tm / sm:.3f}")
    print(f"requests/s (8-token answers): 1 client {r1:.2f}, 4 clients {r4:.2f}   ratio 4/1 {r4 / r1:.2f}")
    return 0 if ratio <= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
