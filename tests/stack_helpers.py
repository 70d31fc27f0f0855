"""Shared by the service tests: a tiny random qwen35moe GGUF with a byte-level tokenizer and a
ChatML template (written directly with gguf, in well under a second), and a running stack."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import gguf
import numpy as np

from common.model.default import default_model_path
from fermium.stack import Stack, free_port

ARCH = "qwen35moe"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{%- for message in messages %}"
          "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
          "{%- endfor %}"
          "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
# width of the tiny model: the real layer pattern (3 linear : 1 full), v heads = 2 x k heads
DIMS = dict(hidden=64, layers=4, heads=4, kv_heads=2, head_dim=16, k_heads=2, v_heads=4, dk=16, dv=16,
            experts=4, used=2, ffn=32, shared_ffn=32, conv=4)


def _byte_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def write_tiny_gguf(path: Path, seed: int = 0, context: int = 512, **dims: int) -> Path:
    """`dims` overrides entries of DIMS (a wider model for benchmarks)."""
    d = {**DIMS, **dims}
    rng = np.random.default_rng(seed)
    tokens = _byte_chars() + ["Ġt", "he", *SPECIALS]
    types = [1] * (len(tokens) - len(SPECIALS)) + [3] * len(SPECIALS)
    vocab, H = len(tokens), d["hidden"]
    w = gguf.GGUFWriter(str(path), ARCH)
    for key, value in {"embedding_length": H, "block_count": d["layers"], "context_length": context,
                       "attention.head_count": d["heads"], "attention.head_count_kv": d["kv_heads"],
                       "attention.key_length": d["head_dim"], "attention.value_length": d["head_dim"],
                       "rope.dimension_count": d["head_dim"] // 4, "full_attention_interval": 4,
                       "ssm.conv_kernel": d["conv"], "ssm.group_count": d["k_heads"], "ssm.state_size": d["dk"],
                       "ssm.time_step_rank": d["v_heads"], "ssm.inner_size": d["v_heads"] * d["dv"],
                       "expert_count": d["experts"], "expert_used_count": d["used"],
                       "expert_feed_forward_length": d["ffn"], "expert_shared_feed_forward_length": d["shared_ffn"]
                       }.items():
        w.add_uint32(f"{ARCH}.{key}", value)
    w.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(f"{ARCH}.rope.freq_base", 10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["Ġ t", "h e"])
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_chat_template(CHATML)

    def t(name: str, *shape: int, scale: float = 0.2) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    nk, nv, dk, dv = d["k_heads"], d["v_heads"], d["dk"], d["dv"]
    t("token_embd.weight", vocab, H, scale=1.0)
    t("output_norm.weight", H)
    # only printable ASCII can win a greedy pick, so streamed text and decoded text agree exactly
    head = rng.standard_normal((vocab, H)).astype(np.float32) * 0.2
    head[[i for i in range(vocab) if not (i < 256 and 0x20 <= i < 0x7f)]] = 0.0
    w.add_tensor("output.weight", head)
    for i in range(d["layers"]):
        p = f"blk.{i}."
        t(p + "attn_norm.weight", H)
        t(p + "post_attention_norm.weight", H)
        if (i + 1) % 4:
            t(p + "attn_qkv.weight", 2 * nk * dk + nv * dv, H)
            t(p + "attn_gate.weight", nv * dv, H)
            t(p + "ssm_conv1d.weight", 2 * nk * dk + nv * dv, d["conv"], scale=0.5)
            w.add_tensor(p + "ssm_a", -np.exp(rng.standard_normal(nv) * 0.5).astype(np.float32))
            t(p + "ssm_dt.bias", nv, scale=0.5)
            t(p + "ssm_alpha.weight", nv, H)
            t(p + "ssm_beta.weight", nv, H)
            w.add_tensor(p + "ssm_norm.weight", (1 + rng.standard_normal(dv) * 0.1).astype(np.float32))
            t(p + "ssm_out.weight", H, nv * dv)
        else:
            hd, nh, nkv = d["head_dim"], d["heads"], d["kv_heads"]
            t(p + "attn_q.weight", nh * 2 * hd, H)
            t(p + "attn_k.weight", nkv * hd, H)
            t(p + "attn_v.weight", nkv * hd, H)
            t(p + "attn_q_norm.weight", hd)
            t(p + "attn_k_norm.weight", hd)
            t(p + "attn_output.weight", H, nh * hd)
        t(p + "ffn_gate_inp.weight", d["experts"], H)
        t(p + "ffn_gate_exps.weight", d["experts"], d["ffn"], H)
        t(p + "ffn_up_exps.weight", d["experts"], d["ffn"], H)
        t(p + "ffn_down_exps.weight", d["experts"], H, d["ffn"])
        t(p + "ffn_gate_inp_shexp.weight", H)
        t(p + "ffn_gate_shexp.weight", d["shared_ffn"], H)
        t(p + "ffn_up_shexp.weight", d["shared_ffn"], H)
        t(p + "ffn_down_shexp.weight", H, d["shared_ffn"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def up_stack_kwargs(monkeypatch, **options) -> dict:
    """The keyword arguments that `fermium up` with these options passes to the Stack it starts
    (the Stack is replaced, so nothing starts); the signal handlers up installs are put back."""
    import signal

    import pytest

    from fermium import stack
    from fermium.cli_services import up_command
    from fermium.options import defaults
    seen = {}

    class Started(Exception):
        pass

    def fake_stack(path, **kwargs):
        seen.update(kwargs)
        raise Started

    monkeypatch.setattr(stack, "Stack", fake_stack)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(Started):
            up_command(**{**defaults(up_command), **options})
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    return seen


class DemoReference:
    """The bundled demo model as the stack serves it (its KV type), for the answers a cold run gives:
    `tok`, `config`, `corpus` (its held-out text as ids), cold(ids, n) and text(ids)."""

    def __init__(self):
        from common.kv_cache import DEFAULT_KV_TYPE
        from common.model.default import default_model_path
        from common.model.gguf_file import GGUFModel
        from common.model.tokenizer import Tokenizer
        from common.reference.model import ReferenceModel
        model = GGUFModel(default_model_path())
        self.config = model.config
        self.tok, self.reference = Tokenizer.from_gguf(model), ReferenceModel(model, kv_type=DEFAULT_KV_TYPE)
        self.corpus = self.tok.encode((default_model_path().parent / "heldout_sample.txt").read_text())

    def cold(self, ids: list[int], n: int) -> list[int]:
        """The n greedy tokens after ids, on the reference engine."""
        from common.reference.generate import generate
        from common.sampling import SamplingParams
        return list(generate(self.reference, ids, SamplingParams(), n, self.tok.eos_ids))

    def text(self, ids: list[int]) -> str:
        return self.tok.decode([t for t in ids if t not in self.tok.eos_ids])


@contextmanager
def metered_demo_stack(log_dir: Path, ready_s: float, **kwargs) -> Iterator[Stack]:
    """The demo model's stack on the reference runner, ready, each service's metrics on a free port
    (`stack.metrics_ports`, for scrape); kwargs go to Stack (extra flags, workers)."""
    ports = {name: free_port() for name in ("router", "prefill", "decode")}
    with Stack(str(default_model_path()), port=free_port(), runner="reference", metrics_ports=ports, log_dir=log_dir,
               **kwargs) as s:
        s.wait_ready(ready_s)
        s.metrics_ports = ports
        yield s



def each_reply(sent: list) -> Iterator:
    """What a worker sent, with every DecodeStep opened into its sequences' Tokens, in order."""
    from common.protocol.router import DecodeStep
    for msg in sent:
        yield from (msg.seqs if isinstance(msg, DecodeStep) else [msg])
