"""The demo model's training side: the PyTorch MTP block and the chat data.

The MTP block that tools/train_demo.py trains (tools/demo_mtp.py) must compute what Fermium's
draft step computes on the converted file, or the bundled model's head would be trained for a
different function than the one that drafts. A small random checkpoint, saved as the training
script saves it and converted by `fermium convert`, is checked both ways.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from common.model.convert.writer import convert  # noqa: E402
from common.model.gguf_file import GGUFModel  # noqa: E402
from common.model.tokenizer import Tokenizer  # noqa: E402
from common.reference.model import ReferenceModel  # noqa: E402
from services.router.frontend.chat import ChatOutputParser  # noqa: E402
from tools import train_demo  # noqa: E402
from tools.demo_data import TOOLS, conversations, pieces, render  # noqa: E402
from tools.demo_mtp import MtpBlock  # noqa: E402

TEXT = ("ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east.\n\n"
        "JULIET:\nAy me!\nO Romeo, Romeo, wherefore art thou Romeo?\n\n"
        "ROMEO:\nShall I hear more, or shall I speak at this?\nShe speaks: O, speak again.\n\n") * 8


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo-mtp")
    torch.manual_seed(0)
    shape = train_demo.DemoShape(vocab=320, hidden=64, expert_ffn=32, shared_ffn=32)
    tok = train_demo.train_tokenizer([TEXT], shape.vocab)
    config = train_demo.model_config(shape, tok)
    model = train_demo.Qwen3_5MoeForCausalLM(config).float().eval()
    mtp = MtpBlock(config).eval()
    mtp.apply(model._init_weights)
    with torch.no_grad():                      # norms away from their zero init, so a wrong one shows
        for name, p in list(model.named_parameters()) + list(mtp.named_parameters()):
            if name.endswith("norm.weight") or "layernorm" in name:
                p.normal_(0.0, 0.3)
    train_demo.save_checkpoint(model, mtp, tok, out)
    gguf = out / "demo.gguf"
    convert(out, gguf, "f32", progress=False)
    return model, mtp, GGUFModel(gguf)


def test_pytorch_mtp_block_is_the_draft_step(checkpoint):
    model, mtp, gguf = checkpoint
    reference = ReferenceModel(gguf)
    assert reference.has_mtp and gguf.get("qwen35moe.nextn_predict_layers") == 1
    ids = Tokenizer.from_gguf(gguf).encode(TEXT[:200])[:40]
    x = torch.tensor([ids])
    with torch.no_grad():
        hidden = model.model(input_ids=x, use_cache=False).last_hidden_state      # [1, T, H]
        want = model.lm_head(mtp(model, x[:, 1:], hidden[:, :-1]))[0].numpy()       # [T - 1, V]
    logits, ref_hidden = reference.verify([ids], [reference.new_state()], [reference.new_rollback(len(ids))])
    np.testing.assert_allclose(ref_hidden, hidden[0].numpy(), atol=2e-5)
    got, _ = reference.draft([ids[1:]], ref_hidden[:-1], [reference.new_draft_state()])
    np.testing.assert_allclose(got, want, atol=2e-4 * np.abs(want).max())
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_the_template_tags_are_single_tokens_that_decode_as_text(checkpoint):
    tok = Tokenizer.from_gguf(checkpoint[2])
    for tag in train_demo.ADDED_TOKENS:
        assert len(tok.encode(tag)) == 1, tag
    think = tok.encode("<think>")[0]
    assert not tok.is_special(think) and tok.is_special(tok.encode("<|im_end|>")[0])
    assert checkpoint[2].get("tokenizer.chat_template") == train_demo.TEMPLATE.read_text(encoding="utf-8")


def test_chat_data_parses_back_to_its_messages():
    found = conversations(TEXT * 4, 40, seed=3)
    assert found == conversations(TEXT * 4, 40, seed=3)          # seeded
    calls = 0
    for messages, with_tools in found:
        rendered = render(messages, with_tools)
        parts = pieces(rendered)
        assert "".join(text for text, _ in parts) == rendered
        turns = [text for text, trainable in parts if trainable]
        answers = [m for m in messages if m["role"] == "assistant"]
        assert len(turns) == len(answers)
        for turn, message in zip(turns, answers):
            assert turn.startswith("<think>\n") and turn.endswith("<|im_end|>")
            # the text after the prompt's "<think>\n", as a model generates it
            parsed = ChatOutputParser.parse(turn[len("<think>\n"):-len("<|im_end|>")],
                                            tools=TOOLS if with_tools else None)
            assert parsed.reasoning_content == message["reasoning_content"]
            assert (parsed.content or "") == message["content"]
            want = [c["function"] for c in message.get("tool_calls", [])]
            assert [{"name": c.name, "arguments": json.loads(c.arguments)} for c in parsed.tool_calls] == want
            calls += len(want)
    assert calls > 0
