"""The state bytes a prompt costs on the wire, on the demo model's stack: prefill sends decode the
final state once, and the router each checkpoint's recurrent state with only the KV rows past the
previous one, so what it sends grows linearly with the prompt where whole states from position 0
grew with its square (fermium_prefill_state_bytes_sent_total{kind}); a hit at a checkpoint
assembled from those rows is as exact as before. At a sequence's end decode sends the router the
recurrent state and the generated tokens' KV rows only (fermium_decode_state_bytes_sent_total{to}),
and a chat's next turn starts exactly where the last one ended."""
from __future__ import annotations

import httpx
import numpy as np
import pytest

from common.kv_cache import DEFAULT_KV_TYPE
from common.model.default import default_model_path
from common.model.gguf_file import GGUFModel
from common.state import STATE_DTYPE, state_specs
from tests.stack_helpers import DemoReference, metered_demo_stack
from tests.test_services_e2e import scrape

READY_TIMEOUT_S = 60
EVERY = 512                      # checkpoint interval
LENGTHS = (1000, 4000)           # the demo model's context is 4096
SENT = "fermium_prefill_state_bytes_sent_total{{kind={}}}"
STORED = "fermium_snapshot_stored_total{source=prefill}"
RETURNED = "fermium_decode_state_bytes_sent_total{to=router}"
TURN_TOKENS = 8                  # generated each turn


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with metered_demo_stack(tmp_path_factory.mktemp("stack"), READY_TIMEOUT_S,
                            extra={"router": ["--snapshot-every", str(EVERY)]}) as s:
        yield s


def state_size(pos: int, cfg, recurrent_only: bool = False) -> int:
    """Bytes of the state at `pos` and its logits; only the recurrent arrays' and the logits' with `recurrent_only`."""
    arrays = sum(int(np.prod(shape)) * dtype.itemsize for name, dtype, shape in state_specs(pos, cfg, DEFAULT_KV_TYPE)
                 if not (recurrent_only and name[0] in "kv"))
    return arrays + cfg.vocab_size * np.dtype(STATE_DTYPE).itemsize


def complete(stack, prompt: list[int], max_tokens: int = 1) -> dict:
    r = httpx.post(f"{stack.url}/v1/completions", json={"model": "fermium", "prompt": prompt,
                                                        "max_tokens": max_tokens, "temperature": 0}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_state_bytes_sent_grow_linearly_with_the_prompt(stack, capsys):
    cfg = GGUFModel(default_model_path()).config
    rng = np.random.default_rng(0)
    figures = []
    for n in LENGTHS:
        prompt = [int(t) for t in rng.integers(0, 256, n)]
        before = {**scrape(stack.metrics_ports["prefill"]), **scrape(stack.metrics_ports["router"])}
        complete(stack, prompt)
        after = {**scrape(stack.metrics_ports["prefill"]), **scrape(stack.metrics_ports["router"])}
        snapshot, final = (after[SENT.format(k)] - before[SENT.format(k)] for k in ("snapshot", "final"))
        checkpoints = after[STORED] - before[STORED]
        assert checkpoints == len(range(EVERY, n, EVERY)) + 1                          # and the prompt's end
        assert final == state_size(n, cfg)                                             # once, to decode
        ideal = state_size(n, cfg) + checkpoints * state_size(n, cfg, recurrent_only=True)
        whole = sum(state_size(p, cfg) for p in [*range(EVERY, n, EVERY), n])          # each from position 0
        figures.append(f"{n} tokens: {checkpoints:.0f} snapshots, snapshot {snapshot:.0f} B, final {final:.0f} B, "
                       f"ideal {ideal:.0f} B, ratio {snapshot / ideal:.3f}; whole states would be {whole} B")
        assert snapshot / ideal <= 1.1
    with capsys.disabled():
        print("\n" + "\n".join(figures))


def test_a_hit_at_a_checkpoint_assembled_from_rows_is_exact(stack):
    prompt = [int(t) for t in np.random.default_rng(1).integers(0, 256, 3000)]
    complete(stack, prompt)
    again = complete(stack, prompt[:2600] + [65, 66, 67])
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 2560


def test_each_turn_sends_back_only_its_generated_rows_and_the_next_starts_exactly_there(stack, capsys):
    """Turn 2 starts from turn 1's final state and turn 3 from turn 2's, each assembled by the router
    from the prompt's snapshot and the rows decode sent: its hit is the whole of that state, and its
    tokens are the cold run's."""
    ref = DemoReference()
    cfg, logits = ref.config, ref.config.vocab_size * np.dtype(STATE_DTYPE).itemsize
    prompt, figures, cached = ref.corpus[:700], [], 0
    for turn in range(3):
        before = scrape(stack.metrics_ports["decode"])[RETURNED]
        r = complete(stack, prompt, TURN_TOKENS)
        returned = scrape(stack.metrics_ports["decode"])[RETURNED] - before
        generated = ref.cold(prompt, TURN_TOKENS)
        assert r["choices"][0]["text"] == ref.text(generated) and r["choices"][0]["finish_reason"] == "length"
        assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == cached, f"turn {turn + 1}"
        rows = TURN_TOKENS - 1                              # the last token is sampled, never fed
        assert returned == state_size(rows, cfg) - logits, f"turn {turn + 1}"
        whole = state_size(len(prompt) + rows, cfg) - logits
        figures.append(f"turn {turn + 1}: prompt {len(prompt)} tokens, decode sent back {returned:.0f} B "
                       f"(the whole state: {whole} B)")
        cached = len(prompt) + rows
        prompt = prompt + generated + ref.corpus[1000 + 40 * turn:1040 + 40 * turn]
    with capsys.disabled():
        print("\n" + "\n".join(figures))
