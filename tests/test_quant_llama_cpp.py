"""Files that llama.cpp writes itself (opt-in: FERMIUM_LLAMA_CPP_DIR = a llama.cpp tree built by
`tools/fetch_llama_cpp.sh DEST --build cpu`, which makes llama-quantize and llama-imatrix).

A tiny random Qwen3_5MoeForCausalLM and Qwen3_5ForCausalLM (tests/llama_cpp_quant_helpers.py) go
through llama.cpp's converter to F32, llama-imatrix computes an importance matrix on a random text,
and llama-quantize writes each file type that users download, with the imatrix where the type is an
i-quant or 2-bit, plus two mixes made by hand with --tensor-type as the published "dynamic" files
are. Each file must hold the types it was made for (llama-quantize falls back to others on rows it
cannot block), and on each, every runner's greedy tokens equal llama.cpp's (tools/llama_cpp_logits.c)
and the logits of every step are within a bound per file of llama.cpp's, relative to their largest
magnitude. Both engines read the same quantized weights; what differs is the activations: llama.cpp
rounds them to 8 bits for every quantized matrix, the reference keeps them in float32.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

from . import llama_cpp_quant_helpers as lc

pytestmark = pytest.mark.skipif(not lc.built(), reason="set FERMIUM_LLAMA_CPP_DIR to a llama.cpp tree built "
                                                       "with tools/fetch_llama_cpp.sh DEST --build cpu")
pytest.importorskip("transformers")

KINDS = list(lc.ARCH)
RUNNER_NAMES = ["reference", "native"]
PROMPT = list(range(5, 45))
N_GREEDY = 8
IMATRIX = "imatrix"
MOE_ONLY = {"MXFP4_MOE"}      # on a dense model every MXFP4_MOE tensor is Q8_0

# the mixes as the dynamic quants make them: attention and the SSM at 8 and 6 bits, the FFN by
# layer at 4-5 bits (MXFP4, IQ4_XS among the K-quants) or at 1-3 bits with an imatrix; the regexes
# match ffn_down in ffn_down_exps / ffn_down_shexp (MoE) and ffn_down (dense); the first match wins
MIX_4BIT = ("--token-embedding-type", "q6_k", "--output-tensor-type", "q8_0",
            "--tensor-type", "attn_qkv=q8_0", "--tensor-type", "attn_gate=q8_0", "--tensor-type", "ssm_out=q6_k",
            "--tensor-type", r"blk\.[01]\.ffn_down=q5_k", "--tensor-type", r"blk\.[23]\.ffn_up=mxfp4",
            "--tensor-type", r"blk\.[01]\.ffn_gate=iq4_xs", "--tensor-type", "ffn_up=q5_0",
            "--tensor-type", "ffn_gate=q5_1")
MIX_2BIT = ("--token-embedding-type", "q2_k",
            "--tensor-type", r"blk\.0\.ffn_down=iq3_s", "--tensor-type", r"blk\.1\.ffn_down=q3_k",
            "--tensor-type", "ffn_down=iq3_xxs", "--tensor-type", r"blk\.0\.ffn_up=iq2_xs",
            "--tensor-type", r"blk\.1\.ffn_up=iq2_s", "--tensor-type", r"blk\.2\.ffn_up=iq1_s",
            "--tensor-type", "attn_qkv=q4_k", "--tensor-type", "ssm_out=iq4_nl")

# file -> (llama-quantize's file type, imatrix or not, its other options, types the file must hold)
FILES = {
    "Q2_K": ("Q2_K", IMATRIX, (), {"Q2_K"}),
    "Q3_K_M": ("Q3_K_M", None, (), {"Q3_K"}),
    "Q4_K_S": ("Q4_K_S", None, (), {"Q4_K"}),
    "IQ4_XS": ("IQ4_XS", IMATRIX, (), {"IQ4_XS"}),
    "IQ4_NL": ("IQ4_NL", IMATRIX, (), {"IQ4_NL"}),
    "IQ3_XXS": ("IQ3_XXS", IMATRIX, (), {"IQ3_XXS"}),
    "IQ3_S": ("IQ3_S", IMATRIX, (), {"IQ3_S"}),
    "IQ2_XXS": ("IQ2_XXS", IMATRIX, (), {"IQ2_XXS"}),
    "IQ2_M": ("IQ2_M", IMATRIX, (), {"IQ2_S"}),         # IQ2_M is a mix of IQ2_S and more bits
    "IQ1_M": ("IQ1_M", IMATRIX, (), {"IQ1_M"}),
    "MXFP4_MOE": ("MXFP4_MOE", None, (), {"MXFP4"}),
    "Q4_1": ("Q4_1", None, (), {"Q4_1"}),
    "TQ1_0": ("TQ1_0", None, (), {"TQ1_0"}),           # ternary: llama-quantize writes them for these models
    "TQ2_0": ("TQ2_0", None, (), {"TQ2_0"}),
    "mix-4bit": ("Q4_K_M", None, MIX_4BIT, {"Q4_K", "Q5_K", "Q6_K", "Q8_0", "MXFP4", "IQ4_XS", "Q5_0", "Q5_1"}),
    "mix-2bit": ("IQ2_XXS", IMATRIX, MIX_2BIT, {"IQ2_XXS", "IQ3_S", "Q3_K", "IQ3_XXS", "IQ2_XS", "IQ2_S",
                                                  "IQ1_S", "Q4_K", "IQ4_NL", "Q2_K"}),
}
# file -> largest |Fermium - llama.cpp| over the largest |llama.cpp logit|, at any step. llama.cpp
# rounds the activations to Q8_K (256 values a scale) for K- and i-quant matrices, to Q8_0 (32) for
# Q4_1, IQ4_NL and MXFP4: the second is finer (the reference was within 1.8-5.3% of llama.cpp's on
# the files of the first kind, 1.0-1.5% on those of the second; the native runner within 0.5-2.8%)
Q8_0_ACTIVATIONS = {"IQ4_NL", "MXFP4_MOE", "Q4_1"}
LOGIT_BOUND = {name: dict.fromkeys(RUNNER_NAMES, 0.025 if name in Q8_0_ACTIVATIONS else 0.08) for name in FILES}
CASES = [(kind, name) for kind in KINDS for name in FILES if not (kind != "qwen3_5_moe_text" and name in MOE_ONLY)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(kind, file name) -> llama.cpp's quantized file, made once per module from one checkpoint
    and one imatrix per kind."""
    made: dict = {}

    def get(kind: str, name: str) -> Path:
        if kind not in made:
            root = tmp_path_factory.mktemp(kind)
            lc.build_checkpoint(kind, root / "hf")
            base = lc.convert_f32(root / "hf", root / "f32.gguf")
            made[kind] = (root, base, lc.imatrix(base, root / "imatrix.gguf"))
        root, base, matrix = made[kind]
        out = root / f"{name}.gguf"
        if not out.is_file():
            ftype, use_imatrix, options, _ = FILES[name]
            lc.quantize(base, out, ftype, matrix if use_imatrix else None, options)
        return out
    return get


@pytest.fixture(scope="module")
def llama_cpp(files, tmp_path_factory):
    """(kind, file name) -> llama.cpp's logits after PROMPT and its N_GREEDY greedy tokens."""
    tool = lc.logits_tool(tmp_path_factory.mktemp("tool"))
    ran: dict = {}

    def get(kind: str, name: str) -> tuple[np.ndarray, list[int]]:
        if (kind, name) not in ran:
            ran[kind, name] = lc.llama_cpp_run(tool, files(kind, name), PROMPT, N_GREEDY)
        return ran[kind, name]
    return get


def tensor_types(path: Path) -> Counter:
    return Counter(GGMLQuantizationType(t.tensor_type).name for t in GGUFReader(path).tensors)


@pytest.mark.parametrize("kind,name", CASES)
def test_llama_quantize_wrote_the_intended_types(files, kind, name):
    types = tensor_types(files(kind, name))
    print(f"{kind} {name}: " + ", ".join(f"{t} x{n}" for t, n in sorted(types.items())))
    assert FILES[name][3] <= set(types), f"{name} holds {dict(types)}, not every one of {sorted(FILES[name][3])}"


def _load(path: Path, kind: str, runner: str):
    from common.engines import load_runner
    from common.model.gguf_file import GGUFModel
    try:
        model = GGUFModel(path)
        assert model.config.arch == lc.ARCH[kind]
        return load_runner(runner, model, threads=2)[1]
    except Exception as exc:
        pytest.fail(f"Fermium's {runner} runner does not load llama.cpp's {lc.ARCH[kind]} file "
                    f"{path.name}: {type(exc).__name__}: {exc}")


class Recording:
    """A runner whose logits, prefill's and then each decode step's, are kept in order."""

    def __init__(self, runner):
        self.runner, self.logits = runner, []

    def new_state(self):
        return self.runner.new_state()

    def prefill(self, tokens, state):
        self.logits.append(self.runner.prefill(tokens, state))
        return self.logits[-1]

    def decode(self, tokens, states):
        out = self.runner.decode(tokens, states)
        self.logits.append(out[0])
        return out


def logit_errors(got: list[np.ndarray], want: np.ndarray, tokens: list[int], want_tokens: list[int]) -> list[float]:
    """Largest |got - want| over the largest |want|, per step, over the steps of the same history."""
    same = next((i for i, (a, b) in enumerate(zip(tokens, want_tokens)) if a != b), len(tokens))
    return [float(np.abs(g - w).max() / np.abs(w).max()) for g, w in zip(got[:same + 1], want)]


@pytest.mark.parametrize("runner", RUNNER_NAMES)
@pytest.mark.parametrize("kind,name", CASES)
def test_same_greedy_tokens_and_logits_as_llama_cpp(files, llama_cpp, kind, name, runner):
    """Greedy through common.reference.generate as `fermium generate` runs it; the logits of every
    step whose history is llama.cpp's are compared."""
    from common.reference.generate import generate
    from common.sampling import SamplingParams
    want_logits, want_tokens = llama_cpp(kind, name)
    model = Recording(_load(files(kind, name), kind, runner))
    tokens = list(generate(model, PROMPT, SamplingParams(), N_GREEDY))
    assert all(np.isfinite(x).all() and x.shape == want_logits[0].shape for x in model.logits)
    errors = logit_errors(model.logits, want_logits, tokens, want_tokens)
    print(f"{kind} {name} {runner}: logits within {max(errors):.2e} of llama.cpp's")
    assert max(errors) <= LOGIT_BOUND[name][runner], f"per step: {[f'{e:.2e}' for e in errors]}"
    if tokens != want_tokens:
        step = len(errors) - 1
        top = np.sort(want_logits[step])[-2:]
        pytest.fail(f"greedy tokens {tokens}, llama.cpp's {want_tokens}: at step {step} its top two logits "
                    f"differ by {(top[1] - top[0]) / np.abs(want_logits[step]).max():.3f} of the largest")
