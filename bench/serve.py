"""The server's overhead, measured in one run: prints the machine, then ratios and where the time goes.

1. parsing: a chat request with Open WebUI's ~26 KB tool list (tests/data/open_webui) against one
   without, through what the server does before an answer (strict JSON, the pydantic model, the
   parameter checks, background-task recognition);
2. served answer wall time (non-streamed chat over HTTP) against ``Miita.ask`` in process, for the
   same 32-token answer (newline stop off; target <= 1.10), in alternating rounds; between them
   the same answer through the server's own answer job on its worker thread, in process (the
   hand-off and the serve layer, without HTTP), and the served answer through a raw ``http.client``
   request (without the openai client). CPU seconds per request of the server process and of this
   (client) process say whose CPU the difference is;
3. time to the first streamed token against the non-streamed wall time;
4. requests/s with 1 and with 4 concurrent clients (the server answers one at a time);
5. chat latency while a teach job of --teach-rows rows (default 2000) is in flight: --teach-chats
   answers one after another against the idle wall time of 3. (an answer waits for at most one
   batch of the job, docs/serving.md "Teach jobs"), the rows/s the job decoded meanwhile, and how
   long its cancel took (the job is cancelled, so the memory is left as it was: checked).

    python bench/serve.py [--threads 2] [--rounds 7] [--requests 16] [--seed 0] [--teach-rows 2000]

Both sides run with the server's OpenMP wait policy (serve/openmp.py: OMP_WAIT_POLICY=PASSIVE unless
OMP_WAIT_POLICY or GOMP_SPINCOUNT is set in the environment; the bench re-runs itself with it, as
the server does). Exits 1 if the served/in-process ratio is above --target (default 1.10).
"""
from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def machine() -> str:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor() or "?")
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    vers = ", ".join(f"{p} {version(p)}" for p in ("llama-cpp-python", "fastapi", "uvicorn", "pydantic", "openai"))
    omp = " ".join(f"{k}={os.environ[k]}" for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ)
    return (f"machine: {cpu}, {n} cores usable, load average {os.getloadavg()[0]:.1f}; Python "
            f"{platform.python_version()}, {vers}; OpenMP wait: {omp or 'libgomp default'}")


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def parse_cost(reps: int = 200) -> tuple[float, float]:
    """Median microseconds to take a request body to the answer job's parameters, with and without tools."""
    from miita_edge.serve.guard import strict_loads
    from miita_edge.serve.params import check_chat, gen_params
    from miita_edge.serve.types import ChatRequest

    body = json.loads((ROOT / "tests" / "data" / "open_webui" / "chat_with_tools.json").read_text("utf-8"))
    plain = {k: v for k, v in body.items() if k != "tools"}

    def once(raw: bytes) -> float:
        t0 = time.perf_counter()
        req = ChatRequest.model_validate(strict_loads(raw))
        _, task = check_chat(req)
        gen_params(req, 32, task)
        return time.perf_counter() - t0

    out = []
    for b in (body, plain):
        raw = json.dumps(b).encode()
        out.append(statistics.median(once(raw) for _ in range(reps)) * 1e6)
    return out[0], out[1]


def start_server(mem: Path, threads: int, tmp: Path, teach_rows: int) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__import__("miita_edge").__file__).resolve().parent.parent)] + [os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "miita_edge.cli", "serve", "--memory", f"mem={mem}", "--port",
                             str(port), "--threads", str(threads), "--ctx", "1024", "--max-body", "8MiB",
                             "--max-teach-rows", str(max(2000, teach_rows))], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(tmp / "server.log", "wb"))
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/v1/models", timeout=2)
            return proc, url
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the server did not start")


class InProcessServe:
    """The server's answer job on its own worker thread, awaited from an event loop, in this process."""

    def __init__(self, mem: Path, threads: int):
        from miita_edge.serve.memories import Registry
        from miita_edge.serve.settings import Settings

        self.reg = Registry(Settings(memories={"mem": mem}, threads=threads, n_ctx=1024))
        self.loop = asyncio.new_event_loop()

    def ask(self, query: str, tokens: int) -> str:
        from miita_edge.serve.answer import answer_job
        from miita_edge.serve.params import gen_params
        from miita_edge.serve.types import ChatRequest

        async def go():
            req = ChatRequest(model="mem", messages=[{"role": "user", "content": query}], max_tokens=tokens,
                              miita={"newline_stop": False})
            p = gen_params(req, 32, None)
            return await self.reg.run(answer_job, self.reg, "mem", query, req.messages, p, None)

        return self.loop.run_until_complete(go()).choices[0].text

    def close(self):
        self.reg.close()
        self.loop.close()


def raw_post(url: str, body: dict) -> dict:
    host, port = url.removeprefix("http://").split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=600)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    out = json.loads(c.getresponse().read())
    c.close()
    return out


def http_json(url: str, method: str, path: str, body=None) -> tuple[int, dict]:
    host, port = url.removeprefix("http://").split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=600)
    try:
        c.request(method, path, None if body is None else json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, json.loads(r.read())
    finally:
        c.close()


def teach_latency(url: str, client, kw: dict, rows: list[dict], n_rows: int, n_chats: int) -> dict:
    """Chat wall times while a teach job of ``n_rows`` rows runs, then its cancel (nothing committed)."""
    rows = [{"input": f"{rows[i % len(rows)]['input']} (#{i})", "output": rows[i % len(rows)]["output"]}
            for i in range(n_rows)]
    _, before = http_json(url, "GET", "/v1/memories/mem")
    st, job = http_json(url, "POST", "/v1/memories/mem/examples?wait=false", rows)
    assert st == 202, (st, job)
    where = f"/v1/memories/mem/jobs/{job['id']}"
    while http_json(url, "GET", where)[1]["done"] == 0:  # the job is decoding
        time.sleep(0.1)
    t_start, d_start = time.perf_counter(), http_json(url, "GET", where)[1]["done"]
    walls = []
    for _ in range(n_chats):
        t0 = time.perf_counter()
        client.chat.completions.create(**kw)
        walls.append(time.perf_counter() - t0)
    polled = http_json(url, "GET", where)[1]
    rate = (polled["done"] - d_start) / (time.perf_counter() - t_start)
    t0 = time.perf_counter()
    st, end = http_json(url, "DELETE", where)
    cancel = time.perf_counter() - t0
    _, after = http_json(url, "GET", "/v1/memories/mem")
    assert st == 200 and end["state"] == "cancelled" and after["version"] == before["version"], (st, end, after)
    return {"walls": walls, "rate": rate, "cancel": cancel, "done": end["done"], "state": polled["state"]}


def teach_to_end(url: str, client, kw: dict, rows: list[dict], n_rows: int, pause: float) -> dict:
    """Chat wall times while a teach job of ``n_rows`` rows runs to its end, commit included: one
    answer every ``pause`` seconds (a user, not a flood), each tagged with what the job was doing
    when the answer was asked (decoding, or committing once every row was decoded)."""
    rows = [{"input": f"{rows[i % len(rows)]['input']} (#{i})", "output": rows[i % len(rows)]["output"]}
            for i in range(n_rows)]
    _, before = http_json(url, "GET", "/v1/memories/mem")
    t_start = time.perf_counter()
    st, job = http_json(url, "POST", "/v1/memories/mem/examples?wait=false", rows)
    assert st == 202, (st, job)
    where = f"/v1/memories/mem/jobs/{job['id']}"
    walls, t_decoded = [], None
    while True:
        polled = http_json(url, "GET", where)[1]
        if polled["state"] not in ("queued", "running"):
            break
        if polled["done"] >= n_rows and t_decoded is None:
            t_decoded = time.perf_counter()
        phase = "commit" if polled["done"] >= n_rows else "decode"
        t0 = time.perf_counter()
        client.chat.completions.create(**kw)
        walls.append((phase, time.perf_counter() - t0))
        time.sleep(pause)
    t_end = time.perf_counter()
    _, after = http_json(url, "GET", "/v1/memories/mem")
    assert polled["state"] == "done" and after["version"] == before["version"] + 1, (polled, before, after)
    return {"walls": walls, "seconds": t_end - t_start, "decoded_at": t_decoded, "start": t_start,
            "finished": polled["finished"] - polled["started"], "result": polled["result"], "after": after}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--requests", type=int, default=16, help="requests per client count for requests/s")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--target", type=float, default=1.10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--teach-rows", type=int, default=2000, help="rows of the teach job of 5.")
    ap.add_argument("--teach-chats", type=int, default=8, help="answers timed while it runs")
    ap.add_argument("--teach-to-end", action="store_true",
                    help="only the teach: let the job run to its commit, one answer every --chat-pause s "
                         "throughout (the other parts are skipped)")
    ap.add_argument("--chat-pause", type=float, default=5.0, help="seconds between answers with --teach-to-end")
    args = ap.parse_args()
    from miita_edge.serve.openmp import reexec_passive

    reexec_passive([__file__, *sys.argv[1:]])  # the server's OpenMP policy, on this side too
    import openai

    from miita_edge import Example, Miita
    from miita_edge.runtime.engine import EngineConfig

    print(f"command: python bench/serve.py {shlex.join(sys.argv[1:])}")
    print(machine())
    tools_us, plain_us = parse_cost()
    print(f"parse a chat request: with Open WebUI's 26 KB tools {tools_us:7.0f} us, without {plain_us:5.0f} us")

    rows = [json.loads(x) for x in (Path(__import__("miita_edge").__file__).parent / "demo" / "stream.jsonl")
            .read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"][:40]
    query = [r for r in rows if r["split"] == "test"][args.seed % 80]["input"]
    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    mem = tmp / "mem"
    m = Miita(memory=mem, engine_config=EngineConfig(n_threads=args.threads, n_ctx=1024))
    m.ingest([Example(r["input"], r["output"]) for r in train])
    proc, url = start_server(mem, args.threads, tmp, args.teach_rows)
    inproc = InProcessServe(mem, args.threads)
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    msgs = [{"role": "user", "content": query}]
    kw = dict(model="mem", messages=msgs, max_tokens=args.tokens, temperature=0,
              extra_body={"miita": {"newline_stop": False}})
    raw_body = {"model": "mem", "messages": msgs, "max_tokens": args.tokens, "miita": {"newline_stop": False}}

    if args.teach_to_end:
        try:
            t0 = time.perf_counter()
            client.chat.completions.create(**kw)  # warm
            idle = time.perf_counter() - t0
            te = teach_to_end(url, client, kw, train, args.teach_rows, args.chat_pause)
        finally:
            proc.terminate()
            proc.wait(20)
            inproc.close()
            m.close()
        print(f"idle answer {idle * 1000:.0f} ms; a {args.teach_rows}-row teach job ran to its end in "
              f"{te['seconds']:.0f} s (job's own clock {te['finished']:.0f} s; {args.teach_rows / te['seconds']:.2f} rows/s "
              f"with answers in between); memory after: {json.dumps(te['after'])}")
        for phase in ("decode", "commit"):
            w = sorted(x for p, x in te["walls"] if p == phase)
            if w:
                print(f"answers while the job {phase}d: {len(w)}, median {statistics.median(w) * 1000:.0f} ms, "
                      f"max {w[-1] * 1000:.0f} ms, max wait beyond idle {w[-1] - idle:.1f} s (target <= 10 s)")
        if te["decoded_at"] is not None:
            print(f"commit (every row decoded -> done): about {te['start'] + te['seconds'] - te['decoded_at']:.1f} s")
        worst = max(x for _, x in te["walls"]) - idle
        return 0 if worst <= 10 else 1

    t = {k: [] for k in ("local", "job", "served", "raw", "ttft", "srv_cpu", "cli_cpu", "local_cpu")}
    try:
        client.chat.completions.create(**kw)  # warm everything
        want = m.ask(query, max_tokens=args.tokens, stop=()).text
        inproc.ask(query, args.tokens)
        for _ in range(args.rounds):
            c0, t0 = time.process_time(), time.perf_counter()
            a = m.ask(query, max_tokens=args.tokens, stop=())
            t["local"].append(time.perf_counter() - t0)
            t["local_cpu"].append(time.process_time() - c0)
            t0 = time.perf_counter()
            assert inproc.ask(query, args.tokens) == a.text == want
            t["job"].append(time.perf_counter() - t0)
            s0, c0, t0 = proc_cpu(proc.pid), time.process_time(), time.perf_counter()
            r = client.chat.completions.create(**kw)
            t["served"].append(time.perf_counter() - t0)
            t["cli_cpu"].append(time.process_time() - c0)
            t["srv_cpu"].append(proc_cpu(proc.pid) - s0)
            assert r.choices[0].message.content == a.text, (r.choices[0].message.content, a.text)
            t0 = time.perf_counter()
            assert raw_post(url, raw_body)["choices"][0]["message"]["content"] == a.text
            t["raw"].append(time.perf_counter() - t0)
            t0, first = time.perf_counter(), None
            for ch in client.chat.completions.create(**kw, stream=True):
                if first is None and ch.choices and ch.choices[0].delta.content:
                    first = time.perf_counter() - t0
            t["ttft"].append(first)
        n_tok = r.usage.completion_tokens

        def rps(n_clients: int) -> float:
            per = max(1, args.requests // n_clients)
            small = dict(kw, max_tokens=8)

            def work():
                c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
                for _ in range(per):
                    c.chat.completions.create(**small)
            ts = [threading.Thread(target=work) for _ in range(n_clients)]
            t0 = time.perf_counter()
            for th in ts:
                th.start()
            for th in ts:
                th.join()
            return per * n_clients / (time.perf_counter() - t0)

        r1, r4 = rps(1), rps(4)
        tl = teach_latency(url, client, kw, train, args.teach_rows, args.teach_chats)
    finally:
        proc.terminate()
        proc.wait(20)
        inproc.close()
        m.close()
    med = {k: statistics.median(v) * 1000 for k, v in t.items()}
    lm = med["local"]
    ratio = med["served"] / lm
    print(f"answer: {n_tok} tokens, adapted, memory of {len(train)} demo rows, --threads {args.threads}, "
          f"{args.rounds} rounds (medians); load average now {os.getloadavg()[0]:.1f}")
    print(f"Miita.ask in process           {lm:8.1f} ms   CPU {med['local_cpu']:7.1f} ms")
    print(f"answer job on the worker       {med['job']:8.1f} ms   ratio {med['job'] / lm:.3f}  (hand-off + serve "
          f"layer, in process)")
    print(f"served, raw http.client        {med['raw']:8.1f} ms   ratio {med['raw'] / lm:.3f}")
    print(f"served, openai client          {med['served']:8.1f} ms   ratio served/in-process {ratio:.3f} "
          f"(target <= {args.target:.2f})   CPU: server {med['srv_cpu']:.1f} ms, client {med['cli_cpu']:.1f} ms")
    print(f"first streamed token           {med['ttft']:8.1f} ms   ratio TTFT/non-streamed "
          f"{med['ttft'] / med['served']:.3f}")
    print(f"requests/s (8-token answers): 1 client {r1:.2f}, 4 clients {r4:.2f}   ratio 4/1 {r4 / r1:.2f}")
    w = sorted(x * 1000 for x in tl["walls"])
    print(f"while a {args.teach_rows}-row teach job runs ({tl['rate']:.2f} rows/s decoded meanwhile, still "
          f"{tl['state']}): {len(w)} answers one after another, median {statistics.median(w):8.1f} ms, max "
          f"{w[-1]:8.1f} ms   ratio median/idle {statistics.median(w) / med['served']:.2f}, max wait beyond "
          f"idle {(w[-1] - med['served']) / 1000:.1f} s (target <= 10 s)")
    print(f"cancel (DELETE) after {tl['done']} of {args.teach_rows} rows: answered in {tl['cancel'] * 1000:.0f} ms, "
          f"nothing committed")
    return 0 if ratio <= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
