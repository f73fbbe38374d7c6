"""Would a lossless Q8_0 copy of the Q5_0 weights speed up ingest's key pass, keys still bitwise?

Most of Gemma-3-270M Q4_K_M's layer weights are Q5_0 (``attn_q/k``, ``ffn_gate/up``), which
ggml-cpu runs through llamafile's tinyBLAS, unpacking 5-bit values on every tile. A Q5_0 block (an
f16 scale, 32 integers in [-16, 15]) is exactly a Q8_0 block with the same scale and integers, and
tinyBLAS runs Q8_0 through the same template (the same integer dot products, the same float
multiply-adds in the same order), only without the unpacking. This script writes such a twin GGUF
to a temporary directory, loads it with the re-encoded tensors kept in plain CPU buffers (so they
go through tinyBLAS like the originals; ``--repacked`` lets ggml repack them instead), checks that keys,
``h_q`` and logits are bitwise those of the original, and times key extraction one prompt per
decode (what ships) and batched (``Engine.prompt_keys``), rounds alternating.

    python bench/q8_twin.py [--prompts 160] [--rounds 3] [--threads 2] [--seqs 16]

An experiment, not a product path (docs/benchmarks.md, issue 15 seventh pass).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

def write_twin(src: Path, dst: Path, perturb: bool = False) -> list[str]:
    """``runtime.key_twin.write_q8_twin`` (the product's writer), returning the re-encoded tensors'
    names. ``perturb``: then one integer of the first such tensor moved by one step in the written
    file (a twin that is *not* lossless)."""
    import gguf

    from miita_edge.runtime.key_twin import write_q8_twin

    write_q8_twin(src, dst)
    r = gguf.GGUFReader(str(src))
    names = [t.name for t in r.tensors if t.tensor_type == gguf.GGMLQuantizationType.Q5_0]
    if perturb:
        first = next(t for t in gguf.GGUFReader(str(dst)).tensors if t.name == names[0])
        with open(dst, "r+b") as fh:  # byte 2 of the first Q8_0 block: its first weight (int8)
            fh.seek(first.data_offset + 2)
            q = int.from_bytes(fh.read(1), "little", signed=True)
            fh.seek(first.data_offset + 2)
            fh.write(((q + 1) if q < 15 else (q - 1)).to_bytes(1, "little", signed=True))
    return names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("/work/shared/data/banking77"))
    ap.add_argument("--prompts", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seqs", type=int, default=16, help="prompts per decode for the batched rows")
    ap.add_argument("--repacked", action="store_true", help="let ggml repack the Q8_0 copies (its own Q8_0 kernels) "
                    "instead of keeping them on tinyBLAS")
    ap.add_argument("--perturb", action="store_true", help="move one weight of the twin by one step: shows that the "
                    "bitwise check can fail")
    args = ap.parse_args(argv)

    import llama_cpp as L

    from miita_edge.method.templates import get_template
    from miita_edge.runtime.default_model import resolve_model_path
    from miita_edge.runtime.engine import Engine, EngineConfig

    src = resolve_model_path()
    work = Path(tempfile.mkdtemp(prefix="miita-q8-twin-"))
    twin = work / "twin.gguf"
    t0 = time.perf_counter()
    names = write_twin(src, twin, args.perturb)
    made = time.perf_counter() - t0

    # Keep the re-encoded tensors out of ggml's repacked ("extra") buffers: plain CPU buffers send
    # them through tinyBLAS, as the Q5_0 originals go (the equivalence argued in the docstring).
    lib = ctypes.CDLL(os.path.join(os.path.dirname(L.__file__), "lib", "libggml-cpu.so"))
    lib.ggml_backend_cpu_buffer_type.restype = ctypes.c_void_p

    class Override(ctypes.Structure):  # llama.h's llama_model_tensor_buft_override
        _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]

    pattern = "^(" + "|".join(n.replace(".", r"\.") for n in names) + ")$"
    overrides = (Override * 2)(Override(pattern.encode(), lib.ggml_backend_cpu_buffer_type()), Override(None, None))
    load = L.llama_model_load_from_file

    def load_with_override(path, mparams):
        if path == str(twin).encode() and not args.repacked:
            mparams.tensor_buft_overrides = ctypes.cast(overrides, ctypes.c_void_p)
        return load(path, mparams)

    L.llama_model_load_from_file = load_with_override
    engines = {}
    for name, path in (("original", src), ("Q8_0 twin", twin)):
        for n in (1, args.seqs):
            e = Engine(path, EngineConfig(n_ctx=2048, n_threads=args.threads, n_seq_max=n))
            e.set_key_layers([12, 9], ("last", "mean"))  # the default preset v4's keys
            engines[name, n] = e
    rows = [json.loads(line) for line in open(args.data / "train.jsonl")][: args.prompts]
    eo, et = engines["original", 1], engines["Q8_0 twin", 1]
    banking = get_template("banking77")
    prompts = [eo.tokenize(banking.render_prompt(r["input"])) for r in rows]
    masks = [eo.key_mask(p, True) for p in prompts]
    same = sum(np.array_equal(eo.prompt_key(p, m)[0], et.prompt_key(p, m)[0]) for p, m in zip(prompts, masks))
    qo, qt = eo.query(prompts[0]), et.query(prompts[0])
    print(f"# bench/q8_twin.py  {len(names)} Q5_0 tensors re-encoded as Q8_0 ({twin.stat().st_size / 2**20:.0f} MiB "
          f"twin, {src.stat().st_size / 2**20:.0f} MiB original, written in {made:.1f} s); {len(prompts)} Banking77 "
          f"prompts, threads={args.threads}{', Q8_0 copies repacked' if args.repacked else ''}"
          f"{', one weight perturbed' if args.perturb else ''}")
    print(f"   keys bitwise equal to the original's: {same}/{len(prompts)};  query h_q {np.array_equal(qo.h_q, qt.h_q)}, "
          f"logits {np.array_equal(qo.logits, qt.logits)}")
    rates: dict[tuple[str, int], list[float]] = {k: [] for k in engines}
    for _ in range(args.rounds):
        for (name, n), e in engines.items():
            t0 = time.perf_counter()
            if n == 1:
                for p, m in zip(prompts, masks):
                    e.prompt_key(p, m)
            else:
                e.prompt_keys(prompts, masks)
            rates[name, n].append(len(prompts) / (time.perf_counter() - t0))
    base = statistics.median(rates["original", 1])
    for (name, n), r in rates.items():
        how = "one prompt per decode" if n == 1 else f"{n} prompts per decode"
        med = statistics.median(r)
        print(f"   {name:10s} {how:22s} {med:6.1f} prompts/s  {med / base:5.2f}x the original one per decode")
    for e in engines.values():
        e.close()
    twin.unlink()
    work.rmdir()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
