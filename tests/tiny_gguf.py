"""Tiny generated GGUFs for the multi-architecture tests: random weights, a 512-token SentencePiece
vocabulary with byte fallback, 3 layers of width 256, written with gguf-py's GGUFWriter (f32), then
quantised with llama.cpp's own quantiser (``llama_model_quantize``) so that the LM head has the type
under test. About 1-2 MB each; nothing is downloaded.

They test the adapter's mechanics (tensor names, the head's layout and type, the logit scale), not
answer quality. ``make(arch, head_type, tied, out_dir)`` returns the path of a finished file.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np

N_EMBD = 256  # a multiple of 256: Q4_K and Q6_K rows are whole super-blocks
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = N_EMBD // N_HEAD
N_FF = 512
N_LAYER = 3  # the default key layer n_layer // 2 must be <= n_layer - 2
N_VOCAB = 512
GRANITE_LOGIT_SCALE = 8.0
GEMMA2_SOFTCAP = 30.0

# architectures whose llama.cpp graph is the llama one up to small differences in the tensors
ARCHS = ("llama", "qwen2", "qwen3", "phi3", "granite", "olmo2", "gemma2")
HEAD_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_K", "Q6_K")

_WORDS = ("the a an of to in and is it on for with my was not card money account transfer payment refund "
          "charged twice coffee shop please help where new lost parcel package courier arrived late "
          "exchange rate fee cash atm pin blocked order delivery yes no good bad ok label answer query "
          "intent sentiment review product positive negative neutral what why how when who").split()


def vocab() -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece ('llama') vocabulary of N_VOCAB pieces: <unk>, <s>, </s>, the 256 byte-fallback
    pieces, then words and letters with '▁' word starts; scores order the merges."""
    toks, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [2, 3, 3]
    for b in range(256):
        toks.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(6)
    for c in ("<|end|>", "<|endoftext|>", "<|user|>", "<|assistant|>", "<|system|>", "<|im_start|>", "<|im_end|>"):
        toks.append(c)  # control tokens some architectures look up by name (phi3: <|end|>)
        scores.append(0.0)
        types.append(3)
    pieces: list[str] = ["▁"]
    pieces += ["▁" + w for w in _WORDS]
    pieces += list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,:;!?'\"-()")
    pieces += ["▁" + c for c in "abcdefghijklmnopqrstuvwxyz"]
    for a in "etaoinshrdlcum":
        for b in "etaoinshrdlcum":
            pieces.append(a + b)
    seen = set(toks)
    uniq = [p for p in pieces if not (p in seen or seen.add(p))]
    for i, p in enumerate(uniq[: N_VOCAB - len(toks)]):
        toks.append(p)
        scores.append(-float(i))
        types.append(1)
    while len(toks) < N_VOCAB:  # pad with unused pieces (never produced by the tokenizer)
        toks.append(f"<unused{len(toks)}>")
        scores.append(-1e4)
        types.append(5)
    return toks, scores, types


def _tensors(arch: str, tied: bool, rng: np.random.Generator) -> dict[str, np.ndarray]:
    H, F, V = N_EMBD, N_FF, N_VOCAB
    kv = N_HEAD_KV * HEAD_DIM

    def w(rows, cols, std=None):  # numpy (rows, cols) = ggml ne[0] = cols
        return (rng.standard_normal((rows, cols)) * (std or cols ** -0.5)).astype(np.float32)

    def ones(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    t: dict[str, np.ndarray] = {"token_embd.weight": w(V, H, 1.0), "output_norm.weight": ones(H)}
    if not tied:
        t["output.weight"] = w(V, H)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        if arch == "phi3":
            t[p + "attn_norm.weight"] = ones(H)
            t[p + "attn_qkv.weight"] = w(H + 2 * kv, H)
            t[p + "attn_output.weight"] = w(H, H)
            t[p + "ffn_norm.weight"] = ones(H)
            t[p + "ffn_up.weight"] = w(2 * F, H)  # gate and up, fused
            t[p + "ffn_down.weight"] = w(H, F)
            continue
        t[p + "attn_q.weight"] = w(H, H)
        t[p + "attn_k.weight"] = w(kv, H)
        t[p + "attn_v.weight"] = w(kv, H)
        t[p + "attn_output.weight"] = w(H, H)
        t[p + "ffn_gate.weight"] = w(F, H)
        t[p + "ffn_up.weight"] = w(F, H)
        t[p + "ffn_down.weight"] = w(H, F)
        if arch != "olmo2":  # OLMo-2 normalises after attention and FFN only
            t[p + "attn_norm.weight"] = ones(H)
            t[p + "ffn_norm.weight"] = ones(H)
        if arch == "qwen2":
            for n, size in (("attn_q", H), ("attn_k", kv), ("attn_v", kv)):
                t[p + n + ".bias"] = (0.1 * rng.standard_normal(size)).astype(np.float32)
        if arch == "qwen3":
            t[p + "attn_q_norm.weight"] = ones(HEAD_DIM)
            t[p + "attn_k_norm.weight"] = ones(HEAD_DIM)
        if arch == "olmo2":
            t[p + "attn_q_norm.weight"] = ones(H)
            t[p + "attn_k_norm.weight"] = ones(kv)
            t[p + "post_attention_norm.weight"] = ones(H)
            t[p + "post_ffw_norm.weight"] = ones(H)
        if arch == "gemma2":
            t[p + "post_attention_norm.weight"] = ones(H)
            t[p + "post_ffw_norm.weight"] = ones(H)
    return t


def write_f32(path: str | os.PathLike, arch: str, tied: bool, seed: int = 0,
              tensors: dict[str, np.ndarray] | None = None) -> Path:
    """An f32 GGUF of the architecture with random weights (or ``tensors``, e.g. a rewrite of
    ``_tensors``'s) and the tiny vocabulary."""
    import gguf

    if arch not in ARCHS:
        raise ValueError(f"unknown tiny architecture {arch!r}")
    path = Path(path)
    rng = np.random.default_rng(seed)
    wr = gguf.GGUFWriter(str(path), arch)
    wr.add_name(f"tiny-{arch}")
    wr.add_context_length(512)
    wr.add_embedding_length(N_EMBD)
    wr.add_block_count(N_LAYER)
    wr.add_feed_forward_length(N_FF)
    wr.add_head_count(N_HEAD)
    wr.add_head_count_kv(N_HEAD_KV)
    wr.add_layer_norm_rms_eps(1e-6)
    wr.add_rope_freq_base(10000.0)
    wr.add_rope_dimension_count(HEAD_DIM)
    wr.add_vocab_size(N_VOCAB)
    wr.add_file_type(0)  # ALL_F32
    if arch == "granite":
        wr.add_logit_scale(GRANITE_LOGIT_SCALE)
        wr.add_residual_scale(0.5)
        wr.add_embedding_scale(2.0)
        wr.add_attention_scale(HEAD_DIM ** -0.5)
    if arch == "gemma2":
        wr.add_key_length(HEAD_DIM)
        wr.add_value_length(HEAD_DIM)
        wr.add_attn_logit_softcapping(50.0)
        wr.add_final_logit_softcapping(GEMMA2_SOFTCAP)
        wr.add_sliding_window(64)
    toks, scores, types = vocab()
    wr.add_tokenizer_model("llama")
    wr.add_token_list(toks)
    wr.add_token_scores(scores)
    wr.add_token_types(types)
    wr.add_unk_token_id(0)
    wr.add_bos_token_id(1)
    wr.add_eos_token_id(2)
    wr.add_add_bos_token(True)
    wr.add_add_eos_token(False)
    for name, arr in (tensors if tensors is not None else _tensors(arch, tied, rng)).items():
        wr.add_tensor(name, arr)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path


def quantize(src: str | os.PathLike, dst: str | os.PathLike, head_type: str, body: str = "F16") -> Path:
    """llama.cpp's quantiser: the body to `body`, the LM head (output.weight, or the tied
    token_embd.weight) to `head_type`."""
    import llama_cpp as L

    ftypes = {"F32": L.LLAMA_FTYPE_ALL_F32, "F16": L.LLAMA_FTYPE_MOSTLY_F16, "Q8_0": L.LLAMA_FTYPE_MOSTLY_Q8_0}
    gtypes = {"F32": 0, "F16": 1, "BF16": 30, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}
    p = L.llama_model_quantize_default_params()
    p.nthread = 1
    p.ftype = ftypes[body]
    p.output_tensor_type = gtypes[head_type]
    p.token_embedding_type = gtypes[head_type]
    p.quantize_output_tensor = True
    from miita_edge.runtime.engine import install_log_filter

    install_log_filter(False)
    rc = L.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(p))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {dst}, head {head_type}) failed: {rc}")
    return Path(dst)


def make(arch: str, head_type: str, tied: bool, out_dir: str | os.PathLike, seed: int = 0) -> Path:
    """The tiny model of `arch` with its LM head in `head_type` (cached in out_dir)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = f"{arch}-{'tied' if tied else 'untied'}"
    dst = out_dir / f"tiny-{tag}-{head_type}.gguf"
    if dst.exists():
        return dst
    src = out_dir / f"tiny-{tag}-f32-s{seed}.gguf"
    if not src.exists():
        write_f32(src.with_suffix(".tmp"), arch, tied, seed)
        os.replace(src.with_suffix(".tmp"), src)
    quantize(src, dst.with_suffix(".tmp"), head_type)
    os.replace(dst.with_suffix(".tmp"), dst)
    return dst


if __name__ == "__main__":  # python tests/tiny_gguf.py OUT_DIR: every file the tests use
    import sys

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-ggufs")
    for a in ARCHS:
        for tied in (False, True):
            for ht in HEAD_TYPES:
                print(make(a, ht, tied, out))
