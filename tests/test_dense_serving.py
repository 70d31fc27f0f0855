"""The dense sibling (qwen35) served end to end: `fermium`'s three services as real processes on a
tiny random dense file, the native runner behind prefill and decode, give the greedy text that the
same runner gives in process."""
from __future__ import annotations

import sys
from pathlib import Path

import openai

from common.kv_cache import DEFAULT_KV_TYPE
from common.model.gguf_file import GGUFModel
from common.model.tokenizer import Tokenizer
from common.reference.generate import generate
from common.sampling import SamplingParams
from fermium.stack import Stack, free_port
from native.cpu_runner import CpuRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from make_synthetic_gguf import TINY, write_synthetic  # noqa: E402

READY_TIMEOUT_S = 60        # three Python processes starting on a shared 2-core machine
MAX_TOKENS = 12


def test_a_dense_model_serves_the_in_process_greedy_text(tmp_path):
    path = write_synthetic(tmp_path / "dense.gguf", layers=4, recipe="q4_k_m", widths=TINY, arch="qwen35",
                           byte_tokenizer=True)
    model = GGUFModel(path)
    assert model.config.ffn_kind == "dense"
    tok = Tokenizer.from_gguf(model)
    runner = CpuRunner(model, threads=1, kv_type=DEFAULT_KV_TYPE)
    prompts = ["the cat", "to be or not"]
    want = [tok.decode([t for t in generate(runner, tok.encode(p), SamplingParams(), MAX_TOKENS, tok.eos_ids)
                        if t not in tok.eos_ids]) for p in prompts]
    with Stack(str(path), port=free_port(), runner="native", log_dir=tmp_path) as stack:
        stack.wait_ready(READY_TIMEOUT_S)
        client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=30)
        for prompt, text in zip(prompts, want):
            r = client.completions.create(model="fermium", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
            assert r.choices[0].text == text and len(text) > 0
