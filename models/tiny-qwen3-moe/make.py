"""Make the tiny Qwen3-MoE checkpoint the serving gates run on one GPU (issue 28): same architecture class as the
campaign's Qwen/Qwen3-30B-A3B (`Qwen3MoeForCausalLM`, top-k 8 routing, per-expert gate/up/down projections, q/k
RMSNorm, GQA), a few layers and a small hidden size, weights from a fixed seed, bf16 safetensors, with its
config.json, generation_config.json and a byte-level BPE tokenizer that needs no download.

    python3 models/tiny-qwen3-moe/make.py OUT_DIR          # write the checkpoint into OUT_DIR (created)
    python3 models/tiny-qwen3-moe/make.py --check [OUT_DIR] # make it (into a temporary folder when no OUT_DIR)
                                                            # and compare every file with SHA256SUMS beside this file

Needs only CPython >= 3.10 and numpy (any 1.x or 2.x): no torch, no transformers, no safetensors package, no network,
so the same bytes come out here and on the lent H200 (whose torch venv has numpy). Every weight is a pure function of
(SEED, tensor name, element index): a splitmix64 counter hash in uint64 arithmetic (exact, wraps mod 2**64), its top
24 bits as a uniform in [-1, 1) (exact in float32), times the tensor's scale (one IEEE float32 multiply), rounded to
bf16 to nearest-even with integer operations. The safetensors file is written by hand (8-byte little-endian header
length, the JSON header padded with spaces to 8 bytes, the tensors in name order, contiguous), which is the layout
the safetensors library reads. Nothing here depends on a library version, thread count or CPU.

The tokenizer is written as tokenizers' JSON, not trained: a byte-level BPE with the 256 byte tokens (id = byte
value, GPT-2's byte-to-unicode alphabet) and no merges, plus Qwen's three special tokens. One token is one byte, so
the text vLLM streams back re-tokenizes to the same number of tokens (AIPerf counts output tokens that way). The
lm_head rows of the special tokens and of every byte that is not printable ASCII (or a newline) are zero while the
other logits spread with a standard deviation of about 5, so sampling practically never emits them and the output is
printable ASCII (valid UTF-8).

Invariants: the output folder holds exactly FILES; the same SEED gives the same bytes (SHA256SUMS, checked by
tests/test_tiny_moe.py and by scripts/device/gate_vllm_h200.sh before the model is served); nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np

SEED = 20261203
HERE = Path(__file__).resolve().parent
SUMS = HERE / "SHA256SUMS"
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")

# The family's config (Qwen3MoeConfig field names; Qwen/Qwen3-30B-A3B: hidden 2048, 48 layers, 32 heads / 4 KV heads,
# head_dim 128, 128 experts, top-k 8, moe_intermediate_size 768, norm_topk_prob true), scaled down.
HIDDEN = 512
LAYERS = 4
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 128
EXPERTS = 16
TOP_K = 8
MOE_INTER = 256
DENSE_INTER = 1024  # `intermediate_size`: used only by mlp_only_layers, which this model has none of
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
VOCAB = 256 + len(SPECIALS)
BOS, EOS = 256, 258  # Qwen3: bos <|endoftext|>, eos <|im_end|>
MAX_POS = 4096

STD = 0.02  # initializer_range
LM_HEAD_STD = 0.22  # logits' std ~ sqrt(HIDDEN) * 0.22 ~ 5 after the final RMSNorm


def config() -> dict:
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": BOS,
        "decoder_sparse_step": 1,
        "eos_token_id": EOS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": STD,
        "intermediate_size": DENSE_INTER,
        "max_position_embeddings": MAX_POS,
        "max_window_layers": LAYERS,
        "mlp_only_layers": [],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": MOE_INTER,
        "norm_topk_prob": True,
        "num_attention_heads": HEADS,
        "num_experts": EXPERTS,
        "num_experts_per_tok": TOP_K,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": KV_HEADS,
        "output_router_logits": False,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB,
    }


def generation_config() -> dict:
    # no sampling defaults: the server's (temperature 1) apply, as for AIPerf's requests
    return {"bos_token_id": BOS, "eos_token_id": [EOS, BOS], "pad_token_id": BOS}


def byte_alphabet() -> list[str]:
    """GPT-2's bytes_to_unicode: the printable character standing for each byte 0..255."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


def tokenizer() -> dict:
    vocab = {ch: i for i, ch in enumerate(byte_alphabet())}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": 256 + i,
                "content": s,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, s in enumerate(SPECIALS)
        ],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": SPECIALS[2],
        "pad_token": SPECIALS[0],
        "unk_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POS,
    }


def tensors() -> list[tuple[str, tuple[int, ...], float]]:
    """(name, shape, scale) of every tensor of the checkpoint, in the per-expert layout of the family's checkpoints
    (vLLM's Qwen3MoeModel.load_weights maps `mlp.experts.E.{gate,up,down}_proj` onto its fused experts). A scale of
    1.0 on a 1-D tensor means all ones (RMSNorm weights); 0.0 means zeros."""
    out = [("model.embed_tokens.weight", (VOCAB, HIDDEN), STD)]
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        out += [
            (f"{p}.input_layernorm.weight", (HIDDEN,), 1.0),
            (f"{p}.post_attention_layernorm.weight", (HIDDEN,), 1.0),
            (f"{p}.self_attn.q_proj.weight", (HEADS * HEAD_DIM, HIDDEN), STD),
            (f"{p}.self_attn.k_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN), STD),
            (f"{p}.self_attn.v_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN), STD),
            (f"{p}.self_attn.o_proj.weight", (HIDDEN, HEADS * HEAD_DIM), STD),
            (f"{p}.self_attn.q_norm.weight", (HEAD_DIM,), 1.0),
            (f"{p}.self_attn.k_norm.weight", (HEAD_DIM,), 1.0),
            (f"{p}.mlp.gate.weight", (EXPERTS, HIDDEN), STD),
        ]
        for e in range(EXPERTS):
            q = f"{p}.mlp.experts.{e}"
            out += [
                (f"{q}.gate_proj.weight", (MOE_INTER, HIDDEN), STD),
                (f"{q}.up_proj.weight", (MOE_INTER, HIDDEN), STD),
                (f"{q}.down_proj.weight", (HIDDEN, MOE_INTER), STD),
            ]
    out += [("model.norm.weight", (HIDDEN,), 1.0), ("lm_head.weight", (VOCAB, HIDDEN), LM_HEAD_STD)]
    return sorted(out)


_M64 = (1 << 64) - 1


def _splitmix(key: int, n: int) -> np.ndarray:
    """n uint64 values: splitmix64's output for counters 1..n after `key` (exact uint64 arithmetic)."""
    with np.errstate(over="ignore"):
        z = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(key & _M64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def bf16_bytes(name: str, shape: tuple[int, ...], scale: float) -> bytes:
    """The tensor's bf16 bytes (little-endian), a pure function of (SEED, name, element index, scale)."""
    n = int(np.prod(shape))
    if len(shape) == 1:  # norm weights: exactly `scale` (1.0 -> 0x3F80)
        f = np.full(n, scale, dtype=np.float32)
    else:
        key = int.from_bytes(hashlib.sha256(f"{SEED}:{name}".encode()).digest()[:8], "little")
        u = (_splitmix(key, n) >> np.uint64(40)).astype(np.float32)  # 24 bits: exact
        f = (u * np.float32(2.0**-23) - np.float32(1.0)) * np.float32(scale * 3**0.5)  # uniform, std = scale
        if name == "lm_head.weight":
            f = f.reshape(shape)
            printable = np.zeros(VOCAB, dtype=bool)
            printable[0x20:0x7F] = True
            printable[0x0A] = True
            f[~printable] = 0.0  # never sampled in practice: see the module doc
            f = f.reshape(-1)
    b = f.view(np.uint32)
    rounded = (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return rounded.astype("<u2").tobytes()


def safetensors_bytes() -> bytes:
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, shape, scale in tensors():
        data = bf16_bytes(name, shape, scale)
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def _json(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode()


def contents() -> dict[str, bytes]:
    return {
        "config.json": _json(config()),
        "generation_config.json": _json(generation_config()),
        "model.safetensors": safetensors_bytes(),
        "tokenizer.json": _json(tokenizer()),
        "tokenizer_config.json": _json(tokenizer_config()),
    }


def make(out: Path) -> dict[str, str]:
    """Write every file into `out` (each atomically: a temporary name, then renamed); returns {file: sha256}."""
    out.mkdir(parents=True, exist_ok=True)
    sums = {}
    for name, data in contents().items():
        tmp = out / f".{name}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, out / name)
        sums[name] = hashlib.sha256(data).hexdigest()
    return sums


def read_sums(path: Path = SUMS) -> dict[str, str]:
    """{file: sha256} from a `sha256sum` file (two spaces between digest and name)."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            digest, name = line.split("  ", 1)
            out[name] = digest
    return out


def main(argv: list[str]) -> int:
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    if len(args) > 1 or (not check and not args):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="tiny-qwen3-moe-") as tmp:
        out = Path(args[0]) if args else Path(tmp)
        sums = make(out)
        if not check:
            for name in FILES:
                print(f"{sums[name]}  {name}")
            return 0
        want = read_sums()
        bad = [n for n in FILES if want.get(n) != sums[n]] + sorted(set(want) - set(FILES))
        for n in bad:
            print(f"tiny-qwen3-moe: {n}: sha256 {sums.get(n, 'absent')}, SHA256SUMS says {want.get(n, 'absent')}")
        print(f"tiny-qwen3-moe: {len(FILES) - len(bad)}/{len(FILES)} files as SHA256SUMS says ({out})")
        return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
