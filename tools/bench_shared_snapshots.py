"""The shared snapshot tier (--snapshot-store) on a redis-server on loopback, which this starts.

1. Store and fetch of one 35B-sized snapshot (Qwen3.6-35B-A3B's widths, fermium/prefill_bench_synthetic.py's
   ModelConfig; `--tokens 0`: the recurrent state and logits alone, 63 MiB), through the store
   paths the router runs: SnapshotStore.put until the writer has sent it, and
   SnapshotStore.prefetch on a second store, which fetches, checks and indexes it in RAM.
2. The same snapshot to the disk tier (--snapshot-dir): how long put() holds the router's event
   loop, and when the writer thread has the file on disk.
3. TTFT on the demo model with two stacks (router, prefill, decode each) on that store: a cold
   prefill on router A, then the next turn (the prompt plus a few new tokens) on router B, whose
   snapshot comes from the store; and the same next turn on router A, from its RAM.

    .venv/bin/python tools/bench_shared_snapshots.py --tokens 0 4096 --repeats 5
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench_snapshots import ttft  # noqa: E402

from common.model.default import default_model_path  # noqa: E402
from common.model.gguf_file import GGUFModel  # noqa: E402
from common.model.tokenizer import Tokenizer  # noqa: E402
from common.snapshots import KV_BLOCK, SnapshotStore  # noqa: E402
from common.snapshots.redis_tier import RedisTier  # noqa: E402
from common.snapshots.redis_trust import derive_key  # noqa: E402
from common.state import SequenceState  # noqa: E402
from fermium.prefill_bench_synthetic import QWEN36_35B  # noqa: E402
from fermium.stack import Stack, free_port  # noqa: E402
from tests.redis_helpers import RedisServer  # noqa: E402

KV_TYPE = "f16"
KEY = derive_key("bench")                  # the writer's and the reader's deployment secret


def state_35b(tokens: int, rng) -> SequenceState:
    """A state of the 35B model's widths at `tokens`, random (as incompressible as a real one)."""
    s = SequenceState.empty(QWEN36_35B, KV_TYPE)
    s.pos = tokens
    s.conv = [rng.standard_normal(a.shape, np.float32) for a in s.conv]
    s.ssm = [rng.standard_normal(a.shape, np.float32) for a in s.ssm]
    shape = (tokens, *s.k[0].shape[1:])
    s.k = [rng.standard_normal(shape, np.float32).astype(np.float16) for _ in s.k]
    s.v = [rng.standard_normal(shape, np.float32).astype(np.float16) for _ in s.v]
    return s


def store_and_fetch(url: str, tokens: int, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    put_s, fetch_s = [], []
    for i in range(repeats):
        writer = SnapshotStore(QWEN36_35B, 8 << 30, KV_BLOCK, kv_type=KV_TYPE,
                               shared=RedisTier(url, QWEN36_35B, KV_TYPE, KV_BLOCK, f"bench{i}", key=KEY))
        reader = SnapshotStore(QWEN36_35B, 8 << 30, KV_BLOCK, kv_type=KV_TYPE,
                               shared=RedisTier(url, QWEN36_35B, KV_TYPE, KV_BLOCK, f"bench{i}", key=KEY))
        ids = [int(t) for t in rng.integers(0, 1000, tokens)]
        state = state_35b(tokens, rng)
        logits = rng.standard_normal(QWEN36_35B.vocab_size, np.float32)
        t0 = time.perf_counter()
        writer.put(ids, state, logits)
        assert writer.shared.flush(120)
        put_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        assert reader.prefetch(ids) == tokens or tokens == 0
        fetch_s.append(time.perf_counter() - t0)
        got, got_logits = reader.lookup(ids)
        assert np.array_equal(got.ssm[0], state.ssm[0]) and np.array_equal(got_logits, logits)
        nbytes = state.nbytes + logits.nbytes
        writer.shared.close()
        reader.shared.close()
    return {"tokens": tokens, "snapshot_MiB": round(nbytes / 2 ** 20, 1),
            "store_s_median": round(statistics.median(put_s), 4),
            "fetch_s_median": round(statistics.median(fetch_s), 4),
            "fetch_GiB_per_s": round(nbytes / 2 ** 30 / statistics.median(fetch_s), 2)}


def disk_put(tmp: Path, tokens: int, repeats: int) -> dict:
    """The disk tier: how long put() holds its caller (the router's event loop), and when the
    writer thread has the file on disk."""
    rng = np.random.default_rng(1)
    store = SnapshotStore(QWEN36_35B, 8 << 30, KV_BLOCK, kv_type=KV_TYPE, disk_dir=tmp / f"disk{tokens}")
    put_s, written_s = [], []
    for i in range(repeats):
        ids = [int(t) for t in rng.integers(0, 1000, tokens)] + [i]
        state, logits = state_35b(len(ids), rng), rng.standard_normal(QWEN36_35B.vocab_size, np.float32)
        t0 = time.perf_counter()
        store.put(ids, state, logits)
        put_s.append(time.perf_counter() - t0)
        assert store.flush(120)
        written_s.append(time.perf_counter() - t0)
    return {"tokens": tokens, "file_MiB": round(store.disk_bytes / repeats / 2 ** 20, 1),
            "put_returns_s_median": round(statistics.median(put_s), 4),
            "file_written_s_median": round(statistics.median(written_s), 4)}


def queue_empty(metrics_port: int) -> bool:
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
    return "fermium_snapshot_store_queue 0.0" in text


def warm_turns(url: str, model: Path, runner: str, prompt_tokens: int, repeats: int, tmp: Path) -> dict:
    text = (ROOT.parent / "shared/data/tinyshakespeare.txt")
    text = text.read_text() if text.exists() else (default_model_path().parent / "heldout_sample.txt").read_text() * 40
    ids = Tokenizer.from_gguf(GGUFModel(model)).encode(text[:400000])
    ports = [free_port(), free_port()]
    stacks = [Stack(str(model), port=free_port(), runner=runner, log_dir=tmp, metrics_ports={"router": p},
                    extra={"router": ["--snapshot-store", url, "--snapshot-key", "bench"]}) for p in ports]
    cold, remote, local = [], [], []
    with stacks[0] as a, stacks[1] as b, httpx.Client() as client:
        a.wait_ready(120)
        b.wait_ready(120)
        for s in (a, b):
            ttft(client, s.url, ids[-8:])        # the connection and the workers, warmed up
        for i in range(repeats):
            turn1 = ids[i * prompt_tokens:(i + 1) * prompt_tokens]
            turn2 = turn1 + ids[-40 - i:-20 - i]
            cold.append(ttft(client, a.url, turn1))
            deadline = time.monotonic() + 30
            while not queue_empty(ports[0]) and time.monotonic() < deadline:
                time.sleep(0.01)
            remote.append(ttft(client, b.url, turn2))
            local.append(ttft(client, a.url, turn2))
    return {"model": str(model), "runner": runner, "prompt_tokens": prompt_tokens, "new_tokens": 20,
            "cold_ttft_s_median": round(statistics.median(cold), 4),
            "warm_via_store_on_other_router_ttft_s_median": round(statistics.median(remote), 4),
            "warm_from_own_ram_ttft_s_median": round(statistics.median(local), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[0], help="positions of the 35B snapshots")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--model", type=Path, default=default_model_path())
    ap.add_argument("--runner", default="native")
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, RedisServer(Path(tmp), maxmemory="4gb").start() as redis:
        result = {"command": " ".join(["python", *sys.argv]),
                  "snapshot_35b": [store_and_fetch(redis.url, t, args.repeats) for t in args.tokens],
                  "disk_35b": [disk_put(Path(tmp), t, args.repeats) for t in args.tokens],
                  "ttft_demo": warm_turns(redis.url, args.model, args.runner, args.prompt_tokens, args.repeats,
                                          Path(tmp))}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
