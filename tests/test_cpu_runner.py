"""The CPU runner against the numpy reference model on tiny synthetic GGUFs."""
from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from common.model.gguf_file import GGUFModel
from common.reference.model import ReferenceModel
from native import cpu_lib
from native.cpu_runner import CpuRunner
from tests import kernel_calls

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from make_synthetic_gguf import TINY, write_synthetic  # noqa: E402

# Float weights: the native runner dots fp32 activations too; only summation order differs.
FLOAT_REL_TOL = 1e-4
# Quantized weights: the native runner rounds activations to 8 bits per block (the reference
# keeps them fp32). Typical token: well under 1% of the largest logit after 4 layers.
QUANT_MEDIAN_REL_TOL = 0.015
# A near-tie in the router can send one token to a different expert on one side; that token's
# logits then move by a few percent. Bounded, not zero.
QUANT_MAX_REL_TOL = 0.1
QUANT_MIN_ARGMAX_AGREEMENT = 0.9
# The batched kernels sum a row's blocks in another order than the one-row kernels.
BATCH_REL_TOL = 1e-5
PROMPT, STEPS = 24, 8


def prompt(n: int = PROMPT, seed: int = 1) -> list[int]:
    return np.random.default_rng(seed).integers(0, TINY.vocab, n).tolist()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    out = {r: write_synthetic(root / f"{r}.gguf", layers=4, recipe=r, widths=TINY)
           for r in ("f32", "q8_0", "q4_0", "q4_k_m", *MIXED)}
    out["next-f32"] = write_synthetic(root / "next-f32.gguf", layers=4, recipe="f32", widths=TINY, arch="qwen3next")
    out["next-q4_0"] = write_synthetic(root / "next-q4_0.gguf", layers=4, recipe="q4_0", widths=TINY, arch="qwen3next")
    for r in ("f32", "q4_k_m"):                 # the dense sibling
        out[f"dense-{r}"] = write_synthetic(root / f"dense-{r}.gguf", layers=4, recipe=r, widths=TINY, arch="qwen35")
    return out


def rel_err(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-token max error relative to the reference's largest logit."""
    return np.abs(a - b).max(axis=-1) / np.abs(b).max()


def greedy(runner, ids: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    state = runner.new_state()
    rows = [runner.prefill(ids, state, all_logits=True)]
    tokens = []
    for _ in range(steps):
        tokens.append(int(np.argmax(rows[-1][-1])))
        rows.append(runner.decode([tokens[-1]], [state]))
    return tokens, np.concatenate(rows)


@pytest.mark.parametrize("name", ["f32", "next-f32", "dense-f32"])
def test_float_files_match_reference_and_greedy_tokens(files, name):
    model = GGUFModel(files[name])
    ref_tokens, ref = greedy(ReferenceModel(model), prompt(), STEPS)
    tokens, got = greedy(CpuRunner(model, threads=2), prompt(), STEPS)
    assert tokens == ref_tokens
    assert rel_err(got, ref).max() <= FLOAT_REL_TOL


# the test files that mix weight types by tensor and by layer, and the types each must hold
MIXED = {
    "lower_bit": {"Q2_K", "Q3_K", "IQ4_XS", "TQ2_0", "TQ1_0"},
    "iq2_mix": {"IQ2_XXS", "IQ2_XS", "IQ2_S"},
    "q32_mix": {"Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "MXFP4"},
    "iq_lowbit_mix": {"IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"},
}


@pytest.mark.parametrize("isa", sorted({"ssse3", cpu_lib.active_isa()}))
@pytest.mark.parametrize("name", ["q8_0", "q4_0", "q4_k_m", "dense-q4_k_m", *MIXED])
def test_quantized_files_track_reference(files, name, isa):
    """The prompt's logits, then one decode step of the reference's next token."""
    model = GGUFModel(files[name])
    assert MIXED.get(name, set()) <= {t.qtype.name for t in model.tensors.values()}
    ref = ReferenceModel(model)
    ref_state = ref.new_state()
    expect = ref.prefill(prompt(), ref_state, all_logits=True)
    token = int(expect[-1].argmax())
    ref_step = ref.decode([token], [ref_state])
    with kernel_calls.isa_restored():
        eng = CpuRunner(model, threads=2, isa=isa)
        state = eng.new_state()
        got = eng.prefill(prompt(), state, all_logits=True)
        step = eng.decode([token], [state])
    err = rel_err(got, expect)
    assert np.median(err) <= QUANT_MEDIAN_REL_TOL, err
    assert max(err.max(), rel_err(step, ref_step).max()) <= QUANT_MAX_REL_TOL, err
    assert (got.argmax(-1) == expect.argmax(-1)).mean() >= QUANT_MIN_ARGMAX_AGREEMENT


@pytest.mark.parametrize("name", ["q4_k_m", "dense-q4_k_m"])
def test_batched_decode_equals_one_at_a_time(files, name):
    model = GGUFModel(files[name])
    eng = CpuRunner(model, threads=2)
    states = [eng.new_state() for _ in range(3)]
    for s, n in zip(states, (5, 11, 0)):       # three different positions
        if n:
            eng.prefill(prompt(n, seed=n), s)
    alone = [s.copy() for s in states]
    tokens = [7, 300, 42]
    batched = eng.decode(tokens, states)
    for b in range(3):
        one = eng.decode([tokens[b]], [alone[b]])[0]
        assert np.abs(batched[b] - one).max() <= BATCH_REL_TOL * np.abs(one).max()
        for x, y in zip(states[b].arrays(), alone[b].arrays()):
            assert np.abs(x - y).max() <= BATCH_REL_TOL * max(np.abs(y).max(), 1.0)
    assert [s.pos for s in states] == [6, 12, 1]


def test_continues_a_reference_prefill_through_kv_growth(files):
    """State handed over from another runner (read-only arrays, as off the wire) decodes on."""
    model = GGUFModel(files["f32"])
    ref, eng = ReferenceModel(model), CpuRunner(model, threads=2)
    s_ref = ref.new_state()
    ref.prefill(prompt(), s_ref)
    s_nat = s_ref.copy()
    for a in s_nat.arrays():
        a.flags.writeable = False
    for step in range(40):                     # crosses a KV buffer regrowth on the way
        tok = (step * 37) % TINY.vocab
        a, b = eng.decode([tok], [s_nat])[0], ref.decode([tok], [s_ref])[0]
        assert np.abs(a - b).max() <= FLOAT_REL_TOL * np.abs(b).max()
    assert s_nat.pos == s_ref.pos == PROMPT + 40
    for x, y in zip(s_nat.arrays(), s_ref.arrays()):
        assert x.shape == y.shape and np.abs(x - y).max() <= 1e-4


@pytest.mark.parametrize("name", ["q4_0", "q4_k_m", "next-f32", "dense-q4_k_m"])
def test_chunked_prefill_equals_token_by_token(files, name):
    """A prompt through fm_prefill in chunks (each weight read once per chunk, the recurrences
    token by token) gives the logits and state of decoding it one token at a time: chunk
    borders anywhere, the KV buffers regrowing inside a chunk (past KV_GROW)."""
    eng = CpuRunner(GGUFModel(files[name]), threads=2)
    ids = prompt(300, seed=3)
    one, chunked = eng.new_state(), eng.new_state()
    expect = np.stack([eng.decode([t], [one])[0] for t in ids])
    got = eng.prefill(ids[:290], chunked, chunk=64, all_logits=True)
    last = eng.prefill(ids[290:], chunked, chunk=3)
    scale = np.abs(expect).max()
    assert got.shape == (290, TINY.vocab) and last.shape == (TINY.vocab,)
    assert np.abs(got - expect[:290]).max() <= BATCH_REL_TOL * scale
    assert np.abs(last - expect[-1]).max() <= BATCH_REL_TOL * scale
    assert chunked.pos == one.pos == 300
    for x, y in zip(chunked.arrays(), one.arrays()):
        assert x.shape == y.shape and np.abs(x - y).max() <= BATCH_REL_TOL * max(np.abs(y).max(), 1.0)


def test_decode_is_deterministic_across_threads(files):
    """The same tokens give bit-identical logits run after run on two threads. A pool that let a
    worker read a new job's fields with the old job's counter ran some tasks twice (a doubled
    conv or state update) and let steps return early: a few runs in 30 went astray."""
    eng = CpuRunner(GGUFModel(files["next-q4_0"]), threads=2)
    ids = prompt(48, seed=5)

    def run() -> np.ndarray:
        state = eng.new_state()
        return np.stack([eng.decode([t], [state])[0] for t in ids])

    first = run()
    for _ in range(20):
        assert np.array_equal(run(), first)


def test_prefill_rejects_bad_input_and_keeps_the_state(files):
    eng = CpuRunner(GGUFModel(files["q4_0"]), threads=2)
    state = eng.new_state()
    eng.prefill(prompt(5), state)
    before = state.copy()
    for ids, kw in (([], {}), ([1, TINY.vocab], {}), ([-1, 2], {}), ([1, 2], {"chunk": 0})):
        with pytest.raises(ValueError):
            eng.prefill(ids, state, **kw)
    assert state.pos == 5
    for x, y in zip(state.arrays(), before.arrays()):
        assert np.array_equal(x, y)


def test_cpu_prefill_backend_runs_the_cpu_runner(files):
    """The prefill service's cpu backend: the native runner where it loads, the reference
    model on request; either one's logits as its own prefill gives them."""
    from common.engines import create_backend
    model = GGUFModel(files["q4_k_m"])
    native = create_backend("cpu", model)
    assert native.runner_name == "native"
    got = native.prefill(prompt(), native.runner.new_state())
    eng = CpuRunner(model, threads=2)
    assert native.chunk is None   # the runner's own chunk
    assert np.array_equal(got, eng.prefill(prompt(), eng.new_state()))
    assert native.stats()["weight_bytes"] > 0 and native.stats()["tokens"] == PROMPT
    ref = create_backend("cpu", model, runner="reference")
    assert ref.runner_name == "reference"
    expect = ReferenceModel(model).prefill(prompt(), ReferenceModel(model).new_state())
    assert np.allclose(ref.prefill(prompt(), ref.runner.new_state()), expect,
                       rtol=1e-5, atol=1e-5 * np.abs(expect).max())


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def test_weights_are_read_in_place(tmp_path):
    """Resident memory grows by at most 1.1x the file: nothing is dequantized or copied."""
    widths = replace(TINY, hidden=1024, experts=64, experts_used=8, expert_ffn=512, vocab=16384)
    path = write_synthetic(tmp_path / "mid.gguf", layers=4, recipe="q4_0", widths=widths)
    before = rss_bytes()
    model = GGUFModel(path)
    eng = CpuRunner(model, threads=2)
    states = [eng.new_state() for _ in range(4)]
    for step in range(4):
        eng.decode([step, 100 + step, 200, 300], states)
    grown = rss_bytes() - before
    assert grown <= 1.1 * path.stat().st_size, (grown, path.stat().st_size)
    # the per-token weight traffic counts routed experts only: far below the file size
    assert 0 < eng.last_bytes < 0.6 * model.nbytes


def test_prefault_maps_the_whole_file_and_reports_progress(tmp_path, monkeypatch):
    """After prefault the file's pages are resident in this process; a file too big for RAM is
    left to fault in as it is touched."""
    import native.cpu_runner as cpu_runner
    from common.model import gguf_reader

    widths = replace(TINY, hidden=512, experts=32, experts_used=4, expert_ffn=256, vocab=8192)
    path = write_synthetic(tmp_path / "pf.gguf", layers=2, recipe="q4_0", widths=widths)
    size = path.stat().st_size
    monkeypatch.setattr(gguf_reader, "PREFAULT_CHUNK", 1 << 20)    # several chunks, several reports
    model = GGUFModel(path)
    before = rss_bytes()
    seen: list[tuple[int, int]] = []
    model.file.prefault(lambda done, total: seen.append((done, total)))
    assert seen[-1] == (size, size) and len(seen) == -(-size // (1 << 20))
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert rss_bytes() - before >= 0.9 * size
    monkeypatch.setattr(cpu_runner, "PREFAULT_RAM_SHARE",
                        size / (2 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")))
    assert not cpu_runner.prefault_weights(GGUFModel(path))
    assert not CpuRunner(GGUFModel(path), threads=1).prefaulted
    assert not CpuRunner(GGUFModel(path), threads=1, prefault=False).prefaulted


def test_bad_requests_are_refused(files):
    eng = CpuRunner(GGUFModel(files["q4_0"]), threads=1)
    with pytest.raises(ValueError, match="out of range"):
        eng.decode([TINY.vocab], [eng.new_state()])
    with pytest.raises(ValueError, match="one token per state"):
        eng.decode([1, 2], [eng.new_state()])


# The demo model (Q8_0): 8-bit activations move a typical token's logits by about 0.5% of the
# largest one; a near-tie in the router (top-2 of a few experts) moves one token's by a few
# percent. A greedy token may then differ only where the reference's top two are closer than
# twice the logits' difference on that row.


def test_demo_model_matches_reference_and_greedy_tokens():
    from common.model.default import default_model_path
    try:
        path = default_model_path()
    except FileNotFoundError as exc:
        pytest.skip(f"no demo model in this checkout: {exc}")
    model = GGUFModel(path)
    ids = np.random.default_rng(5).integers(0, model.config.vocab_size, 32).tolist()
    ref_tokens, ref = greedy(ReferenceModel(model), ids, 16)
    cpu = CpuRunner(model, threads=2)
    state = cpu.new_state()
    # the native runner fed the reference's tokens, so both score the same sequence
    got = np.concatenate([cpu.prefill(ids, state, all_logits=True)]
                         + [cpu.decode([t], [state]) for t in ref_tokens])
    rows = ref[len(ids) - 1:]                          # the rows greedy chose from, and the last
    top2 = np.sort(rows, axis=-1)[:, -2:]
    gap, diff = top2[:, 1] - top2[:, 0], np.abs(got[len(ids) - 1:] - rows).max(axis=-1)
    same = got[len(ids) - 1:].argmax(-1) == rows.argmax(-1)
    assert np.all(same | (gap < 2 * diff)), (same, gap, diff)
    assert same.mean() >= QUANT_MIN_ARGMAX_AGREEMENT
    err = rel_err(got, ref)
    assert np.median(err) <= QUANT_MEDIAN_REL_TOL and err.max() <= QUANT_MAX_REL_TOL, err


def test_bench_cpu_prefill_reports_prompt_rate(files):
    import json

    from typer.testing import CliRunner

    from fermium.cli import app
    out = CliRunner().invoke(app, ["bench", "cpu-prefill", "--model", str(files["q4_0"]), "--threads", "2",
                                   "--prompt", "40", "--chunk", "16", "--rounds", "2", "--baseline-tokens", "4",
                                   "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert report["prompt"] == 40 and report["chunk"] == 16 and len(report["prompt_tok_s"]) == 2
    assert report["median_prompt_tok_s"] > 0 and 0 < report["weights_gb_per_chunk"] < 0.1
    assert report["speedup"] == report["median_prompt_tok_s"] / report["token_by_token_tok_s"]


def test_bench_decode_reports_bandwidth_share(files):
    import json

    from typer.testing import CliRunner

    from fermium.cli import app
    out = CliRunner().invoke(app, ["bench", "decode", "--model", str(files["q4_0"]), "--threads", "2",
                                   "--batch", "2", "--tokens", "2", "--rounds", "1", "--bw-mib", "64", "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    best = report["best"]
    assert report["batch"] == 2 and report["threads"] == 2 and report["bw_buffer_mib"] == 64
    # a tiny model's step is far smaller than any last-level cache: the report says so
    assert report["last_level_cache_mib"] is None or "last-level cache" in report["cache_note"]
    assert best["membw_gbs"] > 0 and best["tok_s"] > 0 and 0 < best["weights_gb_per_step"] < 0.1
    assert abs(best["effective_gbs"] / best["membw_gbs"] - best["bw_ratio"]) < 1e-9
    # a batch is timed against a batch of one in the same rounds
    assert report["median_batch_gain"] == best["batch_gain"] > 0
    # the matvec phases add up to the weight bytes but the embedding rows, and all phases' time
    # fits inside the step's; the mixer heads count the recurrent state and the KV cache
    phases = best["phases"]
    step_s, step_bytes = phases.pop("step")
    _, head_bytes = phases["mixer heads"]
    embedding_rows = 2 * GGUFModel(files["q4_0"]).tensor("token_embd.weight").raw.shape[-1]
    assert sum(b for _, b in phases.values()) - head_bytes + embedding_rows == step_bytes
    assert head_bytes > 0
    assert 0 < sum(s for s, _ in phases.values()) <= step_s
    assert phases["LM head"][1] > 0 and phases["experts gate/up"][1] > 0
    text = CliRunner().invoke(app, ["bench", "decode", "--model", str(files["q4_0"]), "--tokens", "2",
                                    "--rounds", "1", "--bw-mib", "64", "--phases"])
    assert text.exit_code == 0 and "LM head" in text.output and "the rest" in text.output, text.output
    bad = CliRunner().invoke(app, ["bench", "decode", "--model", str(files["q4_0"]), "--isa", "sse9"])
    assert bad.exit_code != 0 and "unknown ISA" in bad.output


def test_bench_probe_outgrows_the_last_level_cache():
    from fermium.cli_bench import cache_resident_note, probe_mib
    assert probe_mib(None) == 256 and probe_mib(32 << 20) == 256
    ram_mib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20
    assert probe_mib(300 << 20) == min(1200, ram_mib // 8 // 2 * 2)   # a 300 MiB Xeon cache
    assert probe_mib(1 << 40) <= ram_mib // 8   # never more than an eighth of the RAM
    assert cache_resident_note(563 << 20, 32 << 20) is None and cache_resident_note(563 << 20, None) is None
    note = cache_resident_note(563 << 20, 300 << 20)
    assert "563 MiB" in note and "300 MiB" in note and "--layers" in note


def test_last_level_cache_is_the_largest_data_cache(tmp_path):
    for index, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "64M"),
                                                  (2, "Unified", "2048K"), (3, "Unified", "300M")]):
        d = tmp_path / "cache" / f"index{index}"
        d.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (d / name).write_text(f"{value}\n")
    assert cpu_lib.last_level_cache_bytes(tmp_path) == 300 << 20
    assert cpu_lib.last_level_cache_bytes(tmp_path / "absent") is None
