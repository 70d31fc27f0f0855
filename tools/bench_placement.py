"""Placement by held state: the wire bytes and the time of a warm turn routed to the prefill worker
that holds its state, against one that must be sent it.

1. The 35B widths (fermium/prefill_bench_synthetic.py's ModelConfig, random state, KV in f16 at `--tokens`): a
   PrefillRequest over a ZeroMQ PUSH/PULL pair on loopback, from `put` until the receiving
   worker's start state is checked and copied (common.protocol.checks), carrying the state's
   bytes or naming a state the worker holds (services/prefill/held.py).
2. TTFT on the demo model with real services (router, two prefill workers, decode): a cold turn,
   then the next turn (its prompt plus a few new tokens) on the worker that holds the state;
   the same with --held-budget 0, where every warm turn is sent the state. The router's
   fermium_state_bytes_sent_total gives the bytes the warm turns put on the wire.

    .venv/bin/python tools/bench_placement.py --tokens 0 4096 --repeats 5
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench_shared_snapshots import KV_TYPE, state_35b  # noqa: E402
from bench_snapshots import ttft  # noqa: E402

from common.model.default import default_model_path  # noqa: E402
from common.model.gguf_file import GGUFModel  # noqa: E402
from common.model.tokenizer import Tokenizer  # noqa: E402
from common.mp import PullQueue, PushQueue  # noqa: E402
from common.protocol.checks import check_prefill  # noqa: E402
from common.protocol.prefill import PrefillRequest  # noqa: E402
from common.sampling import SamplingParams  # noqa: E402
from common.snapshots import KV_BLOCK  # noqa: E402
from common.snapshots.keys import prefix_key  # noqa: E402
from common.state import wire_limits  # noqa: E402
from fermium.prefill_bench_synthetic import QWEN36_35B  # noqa: E402
from fermium.stack import Stack, free_port  # noqa: E402
from services.prefill.held import HeldStates  # noqa: E402

NEW = 8                            # tokens a warm turn adds


def wire(tokens: int, repeats: int) -> dict:
    """Seconds from put to a checked start state on the receiver, with the bytes or the key."""
    rng = np.random.default_rng(0)
    ids = [int(t) for t in rng.integers(0, 1000, tokens + NEW)]
    state = state_35b(tokens, rng)
    held = HeldStates(8 << 30)
    held.put(ids[:tokens], state)
    arrived, done = {}, threading.Event()

    def receive(req: PrefillRequest) -> None:
        if req.held:
            s = held.get(req.held, req.start_pos)
            req = dataclasses.replace(req, start_state=s.arrays(), held="")
        check_prefill(req, QWEN36_35B, KV_TYPE)
        arrived["t"] = time.perf_counter()
        done.set()
    inbox = PullQueue("tcp://127.0.0.1:0", name="bench", on_message=receive, limits=wire_limits(QWEN36_35B))
    push = PushQueue(inbox.address, name="bench->inbox")
    out = {"tokens": tokens, "state_MiB": round(state.nbytes / 2 ** 20, 1)}
    try:
        for mode in ("sent", "held"):
            key = prefix_key(ids[:tokens], KV_BLOCK).hex() if mode == "held" else ""
            req = PrefillRequest("r", ids[tokens:], ids, tokens, "tcp://127.0.0.1:9", SamplingParams(), 4, [], True,
                                 None if key else state.arrays(), 0, KV_TYPE, held=key, hold=True)
            seconds = []
            for _ in range(repeats):
                done.clear()
                t0 = time.perf_counter()
                push.put(req)
                assert done.wait(120), "the request did not arrive"
                seconds.append(arrived["t"] - t0)
            out[f"{mode}_wire_bytes"] = state.nbytes if mode == "sent" else 0
            out[f"{mode}_median_s"] = round(statistics.median(seconds), 4)
    finally:
        push.close()
        inbox.close(wait=1.0)
    return out


def metric(port: int, name: str, labels: dict) -> float:
    from prometheus_client.parser import text_string_to_metric_families
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return sum(x.value for f in text_string_to_metric_families(text) for x in f.samples
               if x.name == name and all(x.labels.get(k) == v for k, v in labels.items()))


def warm_turns(model: Path, runner: str, ids: list[int], tokens: int, repeats: int, budget: str | None) -> dict:
    """Median TTFT of warm turns and the state bytes the router sent for them."""
    workers = ("prefill", "prefill-b", "decode")
    ports = {"router": free_port()}
    held = {w: ["--held-budget", budget] for w in workers[:2]} if budget is not None else {}
    with tempfile.TemporaryDirectory() as tmp, Stack(
            str(model), port=free_port(), runner=runner, log_dir=Path(tmp), workers=workers, metrics_ports=ports,
            extra={"router": ["--snapshot-every", "1024"], **held}) as stack:
        stack.wait_ready(120)
        sent = ("fermium_state_bytes_sent_total", {"role": "prefill"})
        with httpx.Client() as client:
            ttft(client, stack.url, ids[-8:])          # warm the connection up on an unrelated prompt
            seconds, nbytes = [], 0.0
            for i in range(repeats):
                prompt = ids[i * 16:i * 16 + tokens]     # a conversation of its own
                ttft(client, stack.url, prompt)
                time.sleep(0.2)                          # the final state reaches its holder
                before = metric(ports["router"], *sent)
                seconds.append(ttft(client, stack.url, prompt + ids[-NEW:]))
                nbytes += metric(ports["router"], *sent) - before
    return {"warm_ttft_median_s": round(statistics.median(seconds), 4), "state_bytes_sent_per_turn": nbytes / repeats}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[0, 4096], help="35B state positions (part 1)")
    ap.add_argument("--demo-tokens", type=int, default=600, help="prompt length on the demo model (part 2)")
    ap.add_argument("--model", type=Path, default=default_model_path())
    ap.add_argument("--runner", default="reference")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print("command:", " ".join(["python", *sys.argv]))
    for tokens in args.tokens:
        print(json.dumps({"35b_wire": wire(tokens, args.repeats)}))
    ids = Tokenizer.from_gguf(GGUFModel(args.model)).encode((args.model.parent / "heldout_sample.txt").read_text())
    for name, budget in (("to_holder", None), ("to_other_worker", "0")):
        print(json.dumps({f"demo_{name}": warm_turns(args.model, args.runner, ids, args.demo_tokens, args.repeats,
                                                     budget)}))


if __name__ == "__main__":
    main()
