"""models/tiny-qwen3-moe/make.py: the same bytes every time (SHA256SUMS), the family's checkpoint layout, a tokenizer
the pinned AIPerf's transformers loads, and (with the `tinymoe-check` extra) transformers loading and generating."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MAKER = REPO / "models" / "tiny-qwen3-moe" / "make.py"
SUMS = REPO / "models" / "tiny-qwen3-moe" / "SHA256SUMS"


def make(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(MAKER), *args, str(out)], capture_output=True, text=True, timeout=300, check=False
    )


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "tiny-qwen3-moe"
    p = make(out)
    assert p.returncode == 0, p.stderr
    return out


def sums(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_remaking_gives_the_bytes_sha256sums_records(model, tmp_path):
    want = dict(reversed(line.split("  ")) for line in SUMS.read_text().splitlines())
    assert sums(model) == want
    again = tmp_path / "again"
    assert make(again).returncode == 0
    assert sums(again) == want  # a second run, another process: the same bytes
    p = subprocess.run([sys.executable, str(MAKER), "--check"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "5/5 files as SHA256SUMS says" in p.stdout


def test_check_names_a_file_whose_bytes_differ(tmp_path):
    d = tmp_path / "recipe"
    d.mkdir()
    shutil.copy(MAKER, d / "make.py")
    lines = SUMS.read_text().splitlines()
    lines[2] = "0" * 64 + "  model.safetensors"
    (d / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    p = subprocess.run([sys.executable, str(d / "make.py"), "--check"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1
    assert f"model.safetensors: sha256 {SUMS.read_text().splitlines()[2].split()[0]}, SHA256SUMS says {'0' * 64}" in (
        p.stdout
    )


def header(path: Path) -> tuple[dict, int]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), 8 + n


def test_the_checkpoint_has_the_family_layout(model):
    cfg = json.loads((model / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["model_type"] == "qwen3_moe"
    assert (cfg["num_experts"], cfg["num_experts_per_tok"], cfg["norm_topk_prob"]) == (16, 8, True)
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["head_dim"], cfg["vocab_size"]) == (4, 512, 128, 259)
    head, start = header(model / "model.safetensors")
    meta = head.pop("__metadata__")
    assert meta == {"format": "pt"}
    want = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        want |= {f"{p}.{n}.weight" for n in ("input_layernorm", "post_attention_layernorm", "mlp.gate")}
        want |= {f"{p}.self_attn.{n}.weight" for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")}
        want |= {f"{p}.mlp.experts.{e}.{n}.weight" for e in range(16) for n in ("gate_proj", "up_proj", "down_proj")}
    assert set(head) == want
    spans = sorted(tuple(t["data_offsets"]) for t in head.values())
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    size = (model / "model.safetensors").stat().st_size
    assert spans[-1][1] == size - start and size < 100 * 1024 * 1024
    assert {t["dtype"] for t in head.values()} == {"BF16"}
    params = sum(math.prod(t["shape"]) for t in head.values())
    assert params == 28_615_168
    raw = (model / "model.safetensors").read_bytes()
    a, b = head["model.norm.weight"]["data_offsets"]
    assert raw[start + a : start + b] == b"\x80\x3f" * 512  # RMSNorm weights: bf16 1.0
    a, b = head["lm_head.weight"]["data_offsets"]
    rows = raw[start + a : start + b]
    assert all(rows[r * 1024 : (r + 1) * 1024] == b"\0" * 1024 for r in (0, 31, 127, 255, 256, 257, 258))
    assert rows[ord("a") * 1024 : (ord("a") + 1) * 1024] != b"\0" * 1024


def test_the_pinned_aiperfs_transformers_loads_the_tokenizer(model):
    from test_gate_serving import TOOLS, REPO as R
    from reprostack.gates.aiperftool import ensure_aiperf
    from reprostack.lock import load

    tool = ensure_aiperf(load(R / "upstreams.lock"), TOOLS, R)
    script = (
        "import sys; from transformers import AutoTokenizer\n"
        "t = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "s = 'To be, or not to be: that is the question.\\n'\n"
        "ids = t(s)['input_ids']\n"
        "print(len(t), t.eos_token_id, len(ids) == len(s.encode()), t.decode(ids) == s)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    p = subprocess.run([str(tool.python), "-c", script, str(model)], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["259", "258", "True", "True"]


def test_transformers_loads_it_as_qwen3_moe_and_generates(model):
    torch = pytest.importorskip("torch", reason="the tinymoe-check extra (torch, transformers) is not installed")
    transformers = pytest.importorskip("transformers", reason="the tinymoe-check extra is not installed")
    m, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(model), dtype=torch.bfloat16, output_loading_info=True
    )
    assert type(m).__name__ == "Qwen3MoeForCausalLM"
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"])
    tok = transformers.AutoTokenizer.from_pretrained(str(model))
    x = tok("To be, or not to be", return_tensors="pt")
    torch.manual_seed(0)
    out = m.generate(**x, max_new_tokens=12, do_sample=True, top_k=0, top_p=1.0)
    new = out[0, x["input_ids"].shape[1] :].tolist()
    text = tok.decode(new, skip_special_tokens=True)
    assert len(new) == 12 and all(0x20 <= i < 0x7F or i == 0x0A for i in new)
    assert len(tok(text)["input_ids"]) == 12  # one token per byte: the text re-tokenizes to what was generated
