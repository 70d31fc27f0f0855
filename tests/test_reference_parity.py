"""The reference model against transformers on tiny random models of each architecture (the MoE
qwen35moe, qwen3next, and the dense qwen35)."""
from __future__ import annotations

import numpy as np
import pytest

from common.model.gguf_file import GGUFModel
from common.reference.model import ReferenceModel
from tests.conftest import fermium_cli

PROMPT_LEN, GREEDY_STEPS = 100, 32
# float32 on both sides, different summation orders: a relative error of 1e-4 of the largest logit
LOGIT_REL_TOL = 1e-4
# chunked and recurrent forms are algebraically equal; float32 rounding differs. One layer's rule
# agrees to 1e-5 absolute; through a stack of layers the error scales with the values' size.
STATE_TOL = 1e-5


def prompt_ids(vocab: int, n: int = PROMPT_LEN, seed: int = 1) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


def greedy_with_logits(reference: ReferenceModel, ids: list[int], steps: int):
    state = reference.new_state()
    logits = [reference.prefill(ids, state, all_logits=True)]
    tokens = []
    for _ in range(steps):
        tokens.append(int(np.argmax(logits[-1][-1])))
        logits.append(reference.decode([tokens[-1]], [state]))
    return tokens, np.concatenate(logits)[:-1]        # [PROMPT_LEN + steps - 1, vocab]


def test_logits_and_greedy_tokens_match_transformers(tiny_model):
    import torch
    hf, gguf_path, _ = tiny_model
    reference = ReferenceModel(GGUFModel(gguf_path))
    ids = prompt_ids(reference.cfg.vocab_size)
    with torch.no_grad():
        hf_out = hf.generate(torch.tensor([ids]), max_new_tokens=GREEDY_STEPS, do_sample=False,
                             min_new_tokens=GREEDY_STEPS, pad_token_id=0)
    hf_tokens = hf_out[0, PROMPT_LEN:].tolist()
    tokens, ours = greedy_with_logits(reference, ids, GREEDY_STEPS)
    assert tokens == hf_tokens
    with torch.no_grad():
        ref = hf(torch.tensor([ids + tokens[:-1]])).logits[0].numpy()
    bound = LOGIT_REL_TOL * np.abs(ref).max(axis=-1)
    worst = (np.abs(ours - ref).max(axis=-1) / bound).max()
    assert worst <= 1.0, f"logit error {worst:.2f}x the tolerance"


def test_hidden_states_match_transformers(tiny_model):
    """The trunk's output after the final norm, before the LM head, for every prompt position."""
    import torch
    hf, gguf_path, _ = tiny_model
    reference = ReferenceModel(GGUFModel(gguf_path))
    ids = prompt_ids(reference.cfg.vocab_size, 60, seed=6)
    ours = reference.hidden(ids, reference.new_state(), recurrent=False)
    with torch.no_grad():
        ref = hf.model(torch.tensor([ids])).last_hidden_state[0].numpy()
    assert ours.shape == ref.shape
    bound = LOGIT_REL_TOL * np.abs(ref).max(axis=-1)
    worst = (np.abs(ours - ref).max(axis=-1) / bound).max()
    assert worst <= 1.0, f"hidden-state error {worst:.2f}x the tolerance"


def test_chunked_and_recurrent_agree(tiny_model):
    _, gguf_path, _ = tiny_model
    reference = ReferenceModel(GGUFModel(gguf_path))
    ids = prompt_ids(reference.cfg.vocab_size, 150, seed=2)
    chunked, recurrent = reference.new_state(), reference.new_state()
    a = reference.prefill(ids, chunked, all_logits=True, chunk=64)
    b = reference.forward(ids, recurrent, recurrent=True)
    for x, y in zip(chunked.arrays(), recurrent.arrays()):
        assert np.abs(x - y).max() <= STATE_TOL * max(1.0, np.abs(y).max())
    assert np.abs(a - b).max() <= LOGIT_REL_TOL * np.abs(b).max()
    assert chunked.pos == recurrent.pos == len(ids)


def test_prefill_in_pieces_equals_one_prefill(tiny_model):
    _, gguf_path, _ = tiny_model
    reference = ReferenceModel(GGUFModel(gguf_path))
    ids = prompt_ids(reference.cfg.vocab_size, 90, seed=3)
    whole, pieces = reference.new_state(), reference.new_state()
    last = reference.prefill(ids, whole)
    reference.prefill(ids[:37], pieces)
    last_pieces = reference.prefill(ids[37:], pieces)
    assert np.abs(last - last_pieces).max() <= LOGIT_REL_TOL * np.abs(last).max()


# Quantized files: relative RMS error of all logits against the f32 file's. Q8_0 keeps ~8 bits per
# weight, which the 8-layer stack amplifies to a few percent; Q4_0 keeps ~4.5 bits. This tiny model's
# rows (64 wide) are shorter than a K-quant super-block (256), so q4_k_m falls back to Q8_0 here;
# the K-quant formats themselves are held to their own bounds in test_quantize.py.
QUANT_REL_RMS = {"q8_0": 0.05, "q4_0": 0.3, "q4_k_m": 0.05}


@pytest.fixture(scope="module")
def bland_checkpoint(tmp_path_factory):
    from tests.conftest import build_tiny_checkpoint
    root = tmp_path_factory.mktemp("bland")
    build_tiny_checkpoint("qwen3_5_moe_text", root / "hf", bland=True)
    fermium_cli("convert", root / "hf", root / "f32.gguf", "--type", "f32")
    return root


@pytest.mark.parametrize("qtype", sorted(QUANT_REL_RMS))
def test_quantized_files_run_close_to_f32(bland_checkpoint, qtype):
    out = bland_checkpoint / f"{qtype}.gguf"
    fermium_cli("convert", bland_checkpoint / "hf", out, "--type", qtype)
    ids = prompt_ids(320, 40, seed=4)
    f32 = ReferenceModel(GGUFModel(bland_checkpoint / "f32.gguf"))
    ref = f32.prefill(ids, f32.new_state(), all_logits=True)
    quant = ReferenceModel(GGUFModel(out))
    got = quant.prefill(ids, quant.new_state(), all_logits=True)
    assert np.isfinite(got).all()
    assert np.sqrt(np.mean((got - ref) ** 2) / np.mean(ref ** 2)) <= QUANT_REL_RMS[qtype]


def test_the_delta_rule_chunked_equals_recurrent():
    from common.reference.deltanet import chunked_rule, recurrent_rule
    rng = np.random.default_rng(5)
    H, T, dk, dv = 3, 150, 16, 8

    def unit(a):
        return a / np.linalg.norm(a, axis=-1, keepdims=True)

    q, k = unit(rng.standard_normal((2, H, T, dk)).astype(np.float32))
    v = rng.standard_normal((H, T, dv)).astype(np.float32)
    g = -np.abs(rng.standard_normal((H, T))).astype(np.float32)
    beta = rng.uniform(0, 1, (H, T)).astype(np.float32)
    S0 = rng.standard_normal((H, dk, dv)).astype(np.float32)
    o_rec, s_rec = recurrent_rule(q, k, v, g, beta, S0)
    for chunk in (1, 7, 64):
        o_chk, s_chk, _ = chunked_rule(q, k, v, g, beta, S0, chunk)
        assert np.abs(s_chk - s_rec).max() <= STATE_TOL
        assert np.abs(o_chk - o_rec).max() <= STATE_TOL
