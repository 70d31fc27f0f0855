"""The dense sibling against llama.cpp itself (opt-in: FERMIUM_LLAMA_CPP_DIR = a llama.cpp tree with
`tools/fetch_llama_cpp.sh --build cpu` done, so that build-cpu/bin holds libllama and llama-quantize).

A tiny random Qwen3_5ForCausalLM goes through llama.cpp's converter, then llama-quantize; on each
file llama.cpp's greedy tokens and last logits (tools/llama_cpp_logits.c, built here against that
tree) are held against the reference model's and the native CPU runner's.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from common.model.gguf_file import GGUFModel
from common.reference.model import ReferenceModel

from .test_convert import build_checkpoint
from .test_convert_llama_cpp import llama_cpp_convert

LLAMA_CPP = os.environ.get("FERMIUM_LLAMA_CPP_DIR")
BIN = Path(LLAMA_CPP or ".", "build-cpu", "bin")
pytestmark = pytest.mark.skipif(
    not LLAMA_CPP or not (BIN / "llama-quantize").is_file() or not (BIN / "libllama.so").is_file(),
    reason="set FERMIUM_LLAMA_CPP_DIR to a llama.cpp tree built by tools/fetch_llama_cpp.sh --build cpu")

TOOL = Path(__file__).resolve().parents[1] / "tools" / "llama_cpp_logits.c"
PROMPT = list(range(5, 37))
GREEDY = 8
# the largest logit error over the largest logit. F32: the same weights, float32 sums in other
# orders. Quantized: llama.cpp rounds the activations too (Q8_0 or Q8_K rows), the reference keeps
# them float32; this random net's chaotic gates (norms spread by 0.5) amplify that to a few percent
LOGIT_REL = {"F32": 1e-4, "Q8_0": 0.05, "Q4_0": 0.1, "Q6_K": 0.1}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """type -> (llama.cpp's file of that type, llama.cpp's logits, its greedy tokens)."""
    root = tmp_path_factory.mktemp("dense-llama")
    tool = root / "llama_cpp_logits"
    subprocess.run(["cc", "-O2", str(TOOL), f"-I{LLAMA_CPP}/include", f"-I{LLAMA_CPP}/ggml/include", f"-L{BIN}",
                    "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{BIN}", "-o", str(tool)], check=True)
    build_checkpoint("qwen3_5_text", root / "hf", hidden=256, ffn=256)     # rows of 256: the K-quants apply
    config = json.loads((root / "hf" / "config.json").read_text())
    # 4 rotary dims here: llama.cpp's default mRoPE sections (11, 11, 10) would not fit them
    config["rope_parameters"]["mrope_section"] = [1, 1, 0]
    (root / "hf" / "config.json").write_text(json.dumps(config))
    f32 = root / "F32.gguf"
    llama_cpp_convert(root / "hf", f32, "qwen3_5_text", "f32")
    out = {}
    for qtype in LOGIT_REL:
        path = f32 if qtype == "F32" else root / f"{qtype}.gguf"
        if qtype != "F32":
            subprocess.run([str(BIN / "llama-quantize"), str(f32), str(path), qtype], check=True, capture_output=True)
        run = subprocess.run([str(tool), str(path), ",".join(map(str, PROMPT)), str(GREEDY)],
                             capture_output=True, text=True, check=True)
        rows = {line.split()[0]: line.split()[1:] for line in run.stdout.splitlines() if line.split()}
        out[qtype] = (path, np.array(rows["logits"], np.float32), [int(t) for t in rows["greedy"]])
    return out


def greedy(runner, steps: int) -> tuple[np.ndarray, list[int]]:
    state = runner.new_state()
    logits = first = runner.prefill(PROMPT, state)
    tokens = []
    for _ in range(steps):
        tokens.append(int(np.argmax(logits)))
        logits = runner.decode([tokens[-1]], [state])[0]
    return first, tokens


@pytest.mark.parametrize("runner", ["reference", "native"])
@pytest.mark.parametrize("qtype", list(LOGIT_REL))
def test_greedy_tokens_and_logits_as_llama_cpp(files, qtype, runner):
    from native.cpu_runner import CpuRunner
    path, theirs, their_tokens = files[qtype]
    model = GGUFModel(path)
    assert model.config.arch == "qwen35" and model.config.ffn_kind == "dense"
    ours, tokens = greedy(ReferenceModel(model) if runner == "reference" else CpuRunner(model, threads=2), GREEDY)
    assert tokens == their_tokens
    assert np.abs(ours - theirs).max() <= LOGIT_REL[qtype] * np.abs(theirs).max()
