"""Interop with llama.cpp's own converter (opt-in: FERMIUM_LLAMA_CPP_DIR = a llama.cpp tree,
e.g. `export FERMIUM_LLAMA_CPP_DIR=$(tools/fetch_llama_cpp.sh)`).

llama.cpp's convert_hf_to_gguf.py runs on the same tiny checkpoints; every tensor (name, shape,
type, bytes) and every metadata key must match ours, except the two free-text `general.*`
labels that it derives from the directory name and the parameter count. Its pre-tokenizer
detection hashes the real Qwen vocabulary, which a tiny test tokenizer cannot match, so the
run pins the answer (`qwen35` / `qwen2`) that it gives for the real models.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from common.model.convert import convert
from common.model.gguf_file import GGUFModel

from .test_convert import LAYERS, add_mtp, build_checkpoint

LLAMA_CPP = os.environ.get("FERMIUM_LLAMA_CPP_DIR")
pytestmark = pytest.mark.skipif(
    not LLAMA_CPP or not Path(LLAMA_CPP, "convert_hf_to_gguf.py").is_file(),
    reason="set FERMIUM_LLAMA_CPP_DIR to a llama.cpp tree (tools/fetch_llama_cpp.sh)")

FREE_TEXT_KEYS = {"general.name", "general.size_label"}
SSM_A_ATOL = 1e-6          # -exp(A_log) in float32: torch.exp and numpy.exp may differ by an ulp
LOGIT_RTOL = 1e-5          # same weights up to that ulp: logits agree to float32 round-off

DRIVER = """
import runpy, sys
tree, pre = sys.argv[1], sys.argv[2]
sys.argv = [tree + "/convert_hf_to_gguf.py"] + sys.argv[3:]
sys.path.insert(0, tree)
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
runpy.run_path(tree + "/convert_hf_to_gguf.py", run_name="__main__")
"""
PRE = {"qwen3_5_moe_text": "qwen35", "qwen3_next": "qwen2", "qwen3_5_text": "qwen35"}


def llama_cpp_convert(src: Path, out: Path, kind: str, out_type: str, mtp: bool = False) -> None:
    proc = subprocess.run([sys.executable, "-c", DRIVER, LLAMA_CPP, PRE[kind], str(src),
                           "--outfile", str(out), "--outtype", out_type, *([] if mtp else ["--no-mtp"])],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _fields(model: GGUFModel) -> dict:
    return {k: model.get(k) for k in model.keys()
            if not k.startswith("GGUF.") and k not in FREE_TEXT_KEYS}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(kind, out_type, mtp) -> (llama.cpp's file, ours), each converted once per module; with
    `mtp` the checkpoint has an MTP block and both converters keep it."""
    made: dict[tuple[str, str, bool], tuple[GGUFModel, GGUFModel]] = {}

    def get(kind: str, out_type: str, mtp: bool = False) -> tuple[GGUFModel, GGUFModel]:
        if (kind, out_type, mtp) not in made:
            root = tmp_path_factory.mktemp(f"{kind}-{out_type}{'-mtp' if mtp else ''}")
            build_checkpoint(kind, root / "hf")
            if mtp:
                add_mtp(root / "hf")
            llama_cpp_convert(root / "hf", root / "theirs.gguf", kind, out_type, mtp)
            convert(root / "hf", root / "ours.gguf", out_type, progress=False)
            made[kind, out_type, mtp] = GGUFModel(root / "theirs.gguf"), GGUFModel(root / "ours.gguf")
        return made[kind, out_type, mtp]
    return get


@pytest.mark.parametrize("kind", list(PRE))
@pytest.mark.parametrize("out_type,mtp", [("f32", False), ("bf16", False), ("q8_0", False),
                                          ("f32", True), ("q8_0", True)])
def test_same_file_as_llama_cpp(pair, kind, out_type, mtp):
    theirs, ours = pair(kind, out_type, mtp)
    assert any(".nextn." in n for n in theirs.tensors) == mtp
    assert _fields(ours) == _fields(theirs)
    assert set(ours.tensors) == set(theirs.tensors)
    for name, t in theirs.tensors.items():
        o = ours.tensors[name]
        assert (o.qtype, o.shape) == (t.qtype, t.shape), name
        if name.endswith("ssm_a"):
            np.testing.assert_allclose(o.dequant(), t.dequant(), rtol=0, atol=SSM_A_ATOL)
        else:
            assert np.array_equal(o.raw, t.raw), name


@pytest.mark.parametrize("kind", list(PRE))
def test_llama_cpp_file_gives_the_same_logits(pair, kind):
    from common.reference.model import ReferenceModel
    tokens = list(range(5, 45))
    logits = []
    for model in pair(kind, "f32"):
        reference = ReferenceModel(model)
        logits.append(reference.prefill(tokens, reference.new_state(), all_logits=True))
    scale = np.abs(logits[1]).max()
    np.testing.assert_allclose(logits[0], logits[1], rtol=0, atol=LOGIT_RTOL * scale)


@pytest.mark.parametrize("kind", list(PRE))
def test_llama_cpp_mtp_file_drafts_as_ours(pair, kind):
    from common.reference.model import ReferenceModel
    out = []
    for model in pair(kind, "f32", True):
        reference = ReferenceModel(model)
        assert reference.has_mtp and model.config.n_layers == LAYERS
        state = reference.new_state()
        reference.prefill(list(range(5, 25)), state)
        _, hidden = reference.verify([[30, 31, 32]], [state], [reference.new_rollback(2)])
        out.append(reference.draft([[31, 32, 33]], hidden, [reference.new_draft_state()]))
    (theirs, h_theirs), (ours, h_ours) = out
    assert np.isfinite(ours).all()
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=LOGIT_RTOL * np.abs(ours).max())
    np.testing.assert_allclose(h_theirs, h_ours, rtol=0, atol=LOGIT_RTOL * np.abs(h_ours).max())


@pytest.mark.parametrize("kind", list(PRE))
@pytest.mark.parametrize("k", [1, 3])
def test_speculative_greedy_on_llama_cpp_mtp_file_is_plain_greedy(pair, kind, k):
    """llama.cpp's file with MTP kept: the native runner's speculative greedy tokens are its plain ones."""
    from common.reference.generate import generate
    from common.sampling import SamplingParams
    from common.speculative import Speculator
    from native.cpu_runner import CpuRunner
    theirs, _ = pair(kind, "f32", True)
    runner = CpuRunner(theirs, threads=1)
    prompt = list(range(5, 25))
    plain = list(generate(runner, prompt, SamplingParams(), 24))
    spec = Speculator(runner, k)
    assert list(generate(runner, prompt, SamplingParams(), 24, speculator=spec)) == plain
    assert spec.drafted > 0
