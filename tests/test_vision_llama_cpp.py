"""The mmproj against llama.cpp's own converter (opt-in: FERMIUM_LLAMA_CPP_DIR = a llama.cpp tree, as
tests/test_convert_llama_cpp.py): `convert_hf_to_gguf.py --mmproj` on the same tiny checkpoint writes
the file that `fermium convert --mmproj` writes (every tensor's name, shape, type and bytes, every
metadata key but the free-text labels), its text conversion of the same checkpoint is ours too, and the
reference runs on llama.cpp's two files as transformers does."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from common.model.convert.mmproj import convert_mmproj
from common.model.gguf_file import GGUFModel
from common.vision.tensors import MmprojFile

from .vision_helpers import (
    IMAGE_PAD,
    SIZES_FOR_INTEROP,
    VISION_END,
    VISION_START,
    TinyVL,
    hf_image_inputs,
    prompt_with_images,
)

LLAMA_CPP = os.environ.get("FERMIUM_LLAMA_CPP_DIR")
pytestmark = pytest.mark.skipif(
    not LLAMA_CPP or not Path(LLAMA_CPP, "convert_hf_to_gguf.py").is_file(),
    reason="set FERMIUM_LLAMA_CPP_DIR to a llama.cpp tree (tools/fetch_llama_cpp.sh)")
torch = pytest.importorskip("torch")

FREE_TEXT_KEYS = {"general.name", "general.size_label"}
ENCODER_REL_TOL = 1e-5          # as tests/test_vision_model.py
LOGIT_REL_TOL = 1e-4            # as tests/test_vision_model.py
SSM_A_ATOL = 1e-6               # as tests/test_convert_llama_cpp.py: torch.exp and numpy.exp may differ by an ulp
TEXT_DRIVER = """
import runpy, sys
tree = sys.argv[1]
sys.argv = [tree + "/convert_hf_to_gguf.py"] + sys.argv[2:]
sys.path.insert(0, tree)
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen35"
runpy.run_path(tree + "/convert_hf_to_gguf.py", run_name="__main__")
"""


@pytest.fixture(scope="module")
def tiny_vl(tmp_path_factory):
    from .test_convert import write_tiny_tokenizer
    tiny = TinyVL(tmp_path_factory.mktemp("vl"))
    write_tiny_tokenizer(tiny.hf_dir)      # llama.cpp's text conversion needs one
    return tiny


def llama_cpp_text(src: Path, out: Path) -> GGUFModel:
    # its pre-tokenizer detection hashes the real Qwen vocabulary: pinned, as tests/test_convert_llama_cpp.py
    proc = subprocess.run([sys.executable, "-c", TEXT_DRIVER, LLAMA_CPP, str(src), "--outfile", str(out),
                           "--outtype", "f32", "--no-mtp"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return GGUFModel(out)


def llama_cpp_mmproj(src: Path, out: Path, out_type: str) -> GGUFModel:
    proc = subprocess.run([sys.executable, str(Path(LLAMA_CPP, "convert_hf_to_gguf.py")), str(src), "--mmproj",
                           "--outfile", str(out), "--outtype", out_type], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return GGUFModel(out)


def _fields(model: GGUFModel) -> dict:
    return {k: model.get(k) for k in model.keys() if not k.startswith("GGUF.") and k not in FREE_TEXT_KEYS}


@pytest.mark.parametrize("out_type", ["f32", "f16", "bf16", "q8_0"])
def test_same_mmproj_as_llama_cpp(tiny_vl, tmp_path, out_type):
    theirs = llama_cpp_mmproj(tiny_vl.hf_dir, tmp_path / "theirs.gguf", out_type)
    ours = GGUFModel(convert_mmproj(tiny_vl.hf_dir, tmp_path / "ours.gguf", out_type, progress=False).path)
    assert _fields(ours) == _fields(theirs)
    assert list(ours.tensors) == list(theirs.tensors)
    for name, t in theirs.tensors.items():
        o = ours.tensors[name]
        assert (o.qtype, o.shape) == (t.qtype, t.shape), name
        assert np.array_equal(o.raw, t.raw), name


@pytest.mark.parametrize("height,width", SIZES_FOR_INTEROP)
def test_the_reference_encodes_with_llama_cpps_mmproj(tiny_vl, tmp_path, height, width):
    from common.reference.vision import VisionEncoder
    from common.vision.preprocess import preprocess
    encoder = VisionEncoder(MmprojFile(llama_cpp_mmproj(tiny_vl.hf_dir, tmp_path / "theirs.gguf", "f32").path))
    image = tiny_vl.image(height, width, seed=height)
    patches = preprocess(image, encoder.cfg)
    inputs = hf_image_inputs([0] * patches.n_tokens, [image])
    with torch.no_grad():
        ref = tiny_vl.model.model.visual(inputs["pixel_values"], grid_thw=inputs["image_grid_thw"]).pooler_output
    ours = encoder.encode(patches)
    assert np.abs(ours - ref.numpy()).max() <= ENCODER_REL_TOL * np.abs(ref.numpy()).max()


def test_llama_cpps_two_files_give_transformers_logits(tiny_vl, tmp_path):
    from common.model.convert import convert
    from common.reference.model import ReferenceModel
    from common.reference.multimodal import ImageEmbedding, place_images
    from common.reference.vision import VisionEncoder
    from common.vision.preprocess import preprocess
    text = llama_cpp_text(tiny_vl.hf_dir, tmp_path / "text.gguf")
    ours = GGUFModel(convert(tiny_vl.hf_dir, tmp_path / "ours.gguf", "f32", progress=False).path)
    assert _fields(ours) == _fields(text) and text.get("qwen35moe.rope.dimension_sections") == [3, 3, 2, 0]
    for name, t in text.tensors.items():
        if name.endswith("ssm_a"):
            np.testing.assert_allclose(ours.f32(name), t.dequant(), rtol=0, atol=SSM_A_ATOL)
        else:
            assert np.array_equal(ours.tensors[name].raw, t.raw), name
    encoder = VisionEncoder(MmprojFile(llama_cpp_mmproj(tiny_vl.hf_dir, tmp_path / "mmproj.gguf", "f32").path))
    images = [tiny_vl.image(h, w, seed=h) for h, w in SIZES_FOR_INTEROP]
    patches = [preprocess(image, encoder.cfg) for image in images]
    ids = prompt_with_images([p.n_tokens for p in patches], seed=4)
    mm = place_images(ids, [ImageEmbedding(p.token_rows, p.token_cols, encoder.encode(p)) for p in patches],
                      IMAGE_PAD, vision_start=VISION_START, vision_end=VISION_END)
    reference = ReferenceModel(text)
    got = reference.prefill(ids, reference.new_state(), all_logits=True, mm=mm)
    with torch.no_grad():
        ref = tiny_vl.model(**hf_image_inputs(ids, images)).logits[0].numpy()
    assert np.abs(got - ref).max() <= LOGIT_REL_TOL * np.abs(ref).max()
