"""The CPU runner on a tiny file whose tensors mix the 3- and 1-bit i-quants (IQ3_XXS, IQ3_S, IQ1_S,
IQ1_M: a type per tensor and layer, the embedding IQ3_S, the LM head IQ3_XXS), against the numpy
reference within the quantized files' tolerances of test_cpu_runner.py."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from common.model.gguf_file import GGUFModel
from common.reference.model import ReferenceModel
from native import cpu_lib
from native.cpu_runner import CpuRunner
from tests import kernel_calls
from tests.test_cpu_runner import QUANT_MAX_REL_TOL, QUANT_MEDIAN_REL_TOL, QUANT_MIN_ARGMAX_AGREEMENT, prompt, rel_err

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from make_synthetic_gguf import TINY, write_synthetic  # noqa: E402

IQ_LOWBIT = {T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_synthetic(tmp_path_factory.mktemp("iq_lowbit") / "iq_lowbit_mix.gguf", layers=4,
                           recipe="iq_lowbit_mix", widths=TINY)
    return GGUFModel(path)


def test_the_file_mixes_every_type(model):
    assert IQ_LOWBIT <= {t.qtype for t in model.tensors.values()}
    assert model.tensors["token_embd.weight"].qtype == T.IQ3_S
    assert model.tensors["output.weight"].qtype == T.IQ3_XXS
    by_layer = {int(n.split(".")[1]): t.qtype for n, t in model.tensors.items() if n.endswith("ffn_up_exps.weight")}
    assert len(set(by_layer.values())) == 4


@pytest.mark.parametrize("isa", sorted({"ssse3", cpu_lib.active_isa()}))
def test_mixed_file_tracks_reference(model, isa):
    """The prompt's logits (the batched kernels), then one decode step of the reference's next
    token (the one-row kernels)."""
    ref = ReferenceModel(model)
    ref_state = ref.new_state()
    expect = ref.prefill(prompt(), ref_state, all_logits=True)
    token = int(np.argmax(expect[-1]))
    expect = np.concatenate([expect, ref.decode([token], [ref_state])])
    with kernel_calls.isa_restored():
        eng = CpuRunner(model, threads=2, isa=isa)
        state = eng.new_state()
        got = eng.prefill(prompt(), state, all_logits=True)
        got = np.concatenate([got, eng.decode([token], [state])])
    err = rel_err(got, expect)
    assert np.median(err) <= QUANT_MEDIAN_REL_TOL, err
    assert err.max() <= QUANT_MAX_REL_TOL, err
    assert (got.argmax(-1) == expect.argmax(-1)).mean() >= QUANT_MIN_ARGMAX_AGREEMENT
