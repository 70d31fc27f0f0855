"""llama.cpp's own tools on tiny random checkpoints, for tests/test_quant_llama_cpp.py: its converter,
llama-imatrix and llama-quantize write the files, tools/llama_cpp_logits.c reads its logits back.

BIN is the build that `tools/fetch_llama_cpp.sh DEST --build cpu` makes in the tree that
FERMIUM_LLAMA_CPP_DIR names (build-cpu/bin: the tools and libllama's shared libraries)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from .test_convert_llama_cpp import DRIVER

REPO = Path(__file__).resolve().parents[1]
LLAMA_CPP = os.environ.get("FERMIUM_LLAMA_CPP_DIR")
BIN = Path(LLAMA_CPP or ".", "build-cpu", "bin")
TOOLS = ("llama-quantize", "llama-imatrix")

# every matrix's input width a multiple of 256 (hidden, the attention output heads x head_dim,
# the value heads x head_dim, the FFN widths), so no K- or i-quant falls back to another type
WIDTHS = dict(vocab_size=300, hidden_size=256, num_hidden_layers=4, num_attention_heads=2,
              num_key_value_heads=1, head_dim=128, linear_conv_kernel_dim=4, linear_key_head_dim=64,
              linear_value_head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, eos_token_id=282)
# every expert used: a top-k route is a step that llama.cpp's 8-bit rounding of the activations
# flips now and then (its logits then jumped by 10-30% against the reference's with top 2 of 8)
MOE_WIDTHS = dict(num_experts=8, num_experts_per_tok=8, moe_intermediate_size=256,
                  shared_expert_intermediate_size=256)
DENSE_WIDTHS = dict(intermediate_size=512)
ARCH = {"qwen3_5_moe_text": "qwen35moe", "qwen3_5_text": "qwen35"}
# the head row of a token's successor gains this times the token's unit embedding: the greedy tokens
# then lead by margins that 8-bit rounding of the activations does not overturn, and both engines' greedy
# paths are comparable token by token (plain random logits of 300 tokens have top-2 gaps of a few percent)
SUCCESSOR_GAIN = 1.0
CALIBRATION_WORDS = "the quick brown fox jumps over lazy dog a an of to in is was".split()


def built() -> bool:
    return bool(LLAMA_CPP) and Path(LLAMA_CPP, "convert_hf_to_gguf.py").is_file() and \
        all((BIN / t).is_file() for t in TOOLS)


def _run(cmd: list, what: str) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}"
    return proc.stdout


def build_checkpoint(kind: str, d: Path, seed: int = 0) -> None:
    """A tiny random Qwen3_5MoeForCausalLM (kind qwen3_5_moe_text) or Qwen3_5ForCausalLM (qwen3_5_text)."""
    import torch
    import transformers

    from .test_convert import write_tiny_tokenizer
    torch.manual_seed(seed)
    if kind == "qwen3_5_moe_text":
        model = transformers.Qwen3_5MoeForCausalLM(transformers.Qwen3_5MoeTextConfig(**WIDTHS, **MOE_WIDTHS))
    else:
        model = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**WIDTHS, **DENSE_WIDTHS))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:                        # norms, A_log, dt_bias: their init, perturbed
                p.add_(torch.randn_like(p), alpha=0.1)
            elif name.endswith("conv1d.weight"):
                p.normal_(0.0, 0.5)
            else:                                   # unit gain, so rounding is not amplified layer by layer
                p.normal_(0.0, 1.0 if "embed" in name else p.shape[-1] ** -0.5)
        # each token's successor (a random permutation) gets a clear lead in the head's logits
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        successor = torch.randperm(embed.shape[0])
        head[successor] = head[successor] + SUCCESSOR_GAIN * embed / embed.norm(dim=1, keepdim=True)
    model.save_pretrained(d)
    write_tiny_tokenizer(d)


def convert_f32(src: Path, out: Path) -> Path:
    """llama.cpp's convert_hf_to_gguf.py to F32 (its pre-tokenizer pinned, as tests/test_convert_llama_cpp.py)."""
    _run([sys.executable, "-c", DRIVER, LLAMA_CPP, "qwen35", src, "--outfile", out, "--outtype", "f32",
          "--no-mtp"], "convert_hf_to_gguf.py")
    return out


def imatrix(model: Path, out: Path, seed: int = 0) -> Path:
    """llama-imatrix over a random text of the tiny tokenizer's words (16 chunks of 64 tokens)."""
    rng = np.random.default_rng(seed)
    text = out.with_suffix(".txt")
    text.write_text(" ".join(rng.choice(CALIBRATION_WORDS, 3000)))
    _run([BIN / "llama-imatrix", "-m", model, "-f", text, "-o", out, "-c", 64, "-b", 64, "--chunks", 16,
          "-t", 2, "--no-ppl"], "llama-imatrix")
    return out


def quantize(src: Path, out: Path, ftype: str, imatrix_file: Path | None = None,
             overrides: tuple[str, ...] = ()) -> Path:
    """llama-quantize SRC OUT FTYPE, with --imatrix and the given options (--tensor-type ... )."""
    _run([BIN / "llama-quantize", *(["--imatrix", imatrix_file] if imatrix_file else []), *overrides,
          src, out, ftype, 2], f"llama-quantize {ftype}")
    return out


def logits_tool(d: Path) -> Path:
    """tools/llama_cpp_logits.c built against BIN's shared libraries."""
    out = d / "llama_cpp_logits"
    _run(["cc", "-O2", REPO / "tools" / "llama_cpp_logits.c", f"-I{LLAMA_CPP}/include",
          f"-I{LLAMA_CPP}/ggml/include", f"-L{BIN}", "-lllama", "-lggml", "-lggml-base",
          f"-Wl,-rpath,{BIN}", "-o", out], "cc llama_cpp_logits.c")
    return out


def llama_cpp_run(tool: Path, model: Path, tokens: list[int], n_greedy: int) -> tuple[np.ndarray, list[int]]:
    """llama.cpp's n_greedy greedy tokens after `tokens`, and the logits that chose each (n_greedy, vocab)."""
    lines = dict(line.split(" ", 1) for line in _run([tool, model, ",".join(map(str, tokens)), n_greedy],
                                                     "llama_cpp_logits").splitlines() if " " in line)
    steps = [lines["logits"], *(lines[f"step{s}"] for s in range(1, n_greedy))]
    return np.array([s.split() for s in steps], np.float32), [int(t) for t in lines["greedy"].split()]
