"""Snapshots through real processes: hits give the cold path's tokens, chat turns prefill only
their new tokens, and the disk tier survives a router restart but not corruption (of the
payload, or of any header field: tests/snapshot_damage.py)."""
from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from common.kv_cache import DEFAULT_KV_TYPE
from common.model.default import default_model_path
from common.model.gguf_file import GGUFModel
from common.snapshots import disk
from fermium.stack import Stack, free_port
from services.router.engine.prefix_cache import model_folder
from tests.snapshot_damage import DAMAGES
from tests.stack_helpers import DemoReference

READY_TIMEOUT_S = 60
EVERY = 64                       # checkpoint interval: the prefill chunk
MAX_TOKENS = 12
SAVED = "fermium_snapshot_tokens_saved_total"
PREFILLED = "fermium_prefill_tokens_total"


@pytest.fixture(scope="module")
def demo():
    ref = DemoReference()
    return ref.tok, lambda ids, n=MAX_TOKENS: ref.cold(ids, n), ref.corpus


def start(tmp, extra_router: list[str]) -> Stack:
    ports = {name: free_port() for name in ("router", "prefill", "decode")}
    s = Stack(str(default_model_path()), port=free_port(), runner="reference", metrics_ports=ports,
              log_dir=tmp, extra={"router": ["--snapshot-every", str(EVERY), *extra_router]})
    s.metrics_ports = ports
    return s


def metric(stack: Stack, service: str, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{stack.metrics_ports[service]}/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def complete(stack: Stack, prompt, max_tokens: int = MAX_TOKENS) -> dict:
    r = httpx.post(f"{stack.url}/v1/completions", timeout=60, json={
        "model": "fermium", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    r.raise_for_status()
    return r.json()


def counted(stack: Stack, prompt) -> tuple[str, float, float]:
    """(text, tokens saved, tokens prefilled) of one request."""
    saved, prefilled = metric(stack, "router", SAVED), metric(stack, "prefill", PREFILLED)
    text = complete(stack, prompt)["choices"][0]["text"]
    return text, metric(stack, "router", SAVED) - saved, metric(stack, "prefill", PREFILLED) - prefilled


def test_hits_give_the_cold_tokens(tmp_path, demo):
    tok, cold, corpus = demo

    def text_of(ids):
        return tok.decode([t for t in ids if t not in tok.eos_ids])

    long = corpus[:200]
    with start(tmp_path, []) as stack:
        stack.wait_ready(READY_TIMEOUT_S)
        first, saved, prefilled = counted(stack, long)                        # cold: checkpoints at 64..192
        assert first == text_of(cold(long)) and saved == 0 and prefilled == 200

        mid = corpus[:150] + corpus[300:320]                                  # shares 150 tokens: hit at 128
        got, saved, prefilled = counted(stack, mid)
        assert got == text_of(cold(mid)) and saved == 128 and prefilled == len(mid) - 128

        again, saved, prefilled = counted(stack, long)                        # the end of a prompt
        assert again == first and saved == 200 and prefilled == 0

        generated = cold(long)
        follow = long + generated[:-1] + corpus[400:410]                      # after a generation
        got, saved, prefilled = counted(stack, follow)
        assert got == text_of(cold(follow)) and saved == 200 + len(generated) - 1 and prefilled == 10


def test_multi_turn_chat_prefills_only_new_tokens(tmp_path, demo):
    tok = demo[0]
    # between two turns: the last generated token, the end of that turn, and the new turn's frame
    # with its empty think block
    glue = 1 + len(tok.encode("<|im_end|>\n<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n"
                              "<think>\n\n</think>\n\n"))
    turns = ["Who art thou?", "Speak, good sir.", "What news from Rome?", "Away, then!", "Farewell."]
    with start(tmp_path, []) as stack:
        stack.wait_ready(READY_TIMEOUT_S)
        messages, previous = [], None
        for n, text in enumerate(turns):
            messages.append({"role": "user", "content": text})
            before = metric(stack, "prefill", PREFILLED)
            # Qwen3.6's template drops the think block of earlier turns unless told to keep it: with
            # thinking off and kept, an earlier turn renders as it was generated (an empty block)
            r = httpx.post(f"{stack.url}/v1/chat/completions", timeout=60, json={
                "model": "fermium", "messages": messages, "max_tokens": 8, "temperature": 0,
                "chat_template_kwargs": {"enable_thinking": False, "preserve_thinking": True}}).json()
            prefilled = metric(stack, "prefill", PREFILLED) - before
            usage = r["usage"]
            if previous is not None:
                # all but the last generated token were fed to decode and came back as a snapshot
                new_tokens = usage["prompt_tokens"] - (previous["prompt_tokens"] + previous["completion_tokens"] - 1)
                assert prefilled == new_tokens, f"turn {n + 1}"
                assert new_tokens <= len(tok.encode(text)) + glue, f"turn {n + 1}"
            previous = usage
            messages.append({"role": "assistant", "content": r["choices"][0]["message"]["content"]})


def test_disk_tier_survives_restart_and_rejects_corruption(tmp_path, demo):
    _, _, corpus = demo
    prompt = corpus[500:600]
    snap_root = tmp_path / "snapshots"
    snap_dir = model_folder(snap_root, GGUFModel(default_model_path()).fingerprint, DEFAULT_KV_TYPE)
    with start(tmp_path, ["--snapshot-dir", str(snap_root)]) as stack:
        stack.wait_ready(READY_TIMEOUT_S)
        first, _, _ = counted(stack, prompt)

        def restart_router():
            stack.procs["router"].terminate()
            stack.procs["router"].wait(10)
            stack.start("router")
            deadline = time.monotonic() + READY_TIMEOUT_S      # workers re-register by heartbeat
            while time.monotonic() < deadline:
                try:
                    if len(stack.health()["workers"]) == 2:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            raise TimeoutError("workers did not come back to the restarted router")

        restart_router()
        again, saved, prefilled = counted(stack, prompt)
        assert again == first and saved == len(prompt) and prefilled == 0

        files = sorted(snap_dir.glob("*.snap"))
        assert files
        stack.procs["router"].terminate()
        stack.procs["router"].wait(10)
        names = sorted(DAMAGES)                                  # a damage to every file, in turn
        for i, f in enumerate(files):
            DAMAGES[names[(i * 7) % len(names)]](f)
        restart_router()
        third, saved, prefilled = counted(stack, prompt)
        assert third == first and saved == 0 and prefilled == len(prompt)
        for f in snap_dir.glob("*.snap"):                         # corrupt files were replaced, not kept
            disk.read_checked(f)
