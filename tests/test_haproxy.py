"""deploy/haproxy/haproxy.cfg in front of two real routers that share a redis-server: 8
conversations of 5 turns, each turn prefilling only its new tokens; a conversation stays on its
router (every hit is a RAM hit) until that router is killed, and then its next turn on the other
router starts from the shared store's snapshot."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from fermium.stack import free_port
from tests.redis_helpers import RedisServer, needs_redis
from tests.shared_stacks import metric, routers, wait_written
from tests.up_helpers import wait_healthy

CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "haproxy" / "haproxy.cfg"
PREFILLED = "fermium_prefill_tokens_total"
STORE_HITS = "fermium_snapshot_store_hits_total"
REQUESTS = "fermium_requests_total"
CONVERSATIONS, TURNS, KILL_AFTER = 8, 5, 2
MAX_TOKENS = 6
START_S = 30

pytestmark = [needs_redis, pytest.mark.skipif(shutil.which("haproxy") is None,
                                              reason="haproxy is not installed (tools/ci_system_deps.sh installs it)")]


class HAProxy:
    """deploy/haproxy/haproxy.cfg with the test's addresses in its environment."""

    def __init__(self, routers: list[str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "FERMIUM_LB_BIND": f"127.0.0.1:{self.port}",
               "FERMIUM_ROUTER_A": routers[0], "FERMIUM_ROUTER_B": routers[1]}
        self.proc = subprocess.Popen(["haproxy", "-db", "-f", str(CONFIG)], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait_ready(self) -> None:
        wait_healthy(self.url, self.proc, START_S, name="haproxy")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def test_the_config_is_valid():
    subprocess.run(["haproxy", "-c", "-f", str(CONFIG)], check=True, capture_output=True)


def chat(url: str, conversation: int, messages: list[dict]) -> dict:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": "fermium", "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0,
        "user": f"conversation-{conversation}"})
    r.raise_for_status()
    return r.json()


def test_conversations_keep_their_cache_through_haproxy_and_a_router_kill(tmp_path):
    lines = [line for line in (Path(__file__).resolve().parents[1] / "models" / "heldout_sample.txt")
             .read_text().splitlines() if line.strip()]
    with RedisServer(tmp_path).start() as store, routers(tmp_path, store.url, 2) as stacks:
        lb = HAProxy([f"127.0.0.1:{s.port}" for s in stacks])
        try:
            lb.wait_ready()
            history = [[] for _ in range(CONVERSATIONS)]
            previous: list[dict | None] = [None] * CONVERSATIONS
            alive, served = list(stacks), [0.0, 0.0]
            for turn in range(TURNS):
                for c in range(CONVERSATIONS):
                    history[c].append({"role": "user", "content": lines[(c * TURNS + turn) % len(lines)][:60]})
                prefilled = sum(metric(s, "prefill", PREFILLED) for s in stacks)
                hits = [metric(s, "router", STORE_HITS) for s in alive]
                requests = [metric(s, "router", REQUESTS) for s in alive]
                with ThreadPoolExecutor(CONVERSATIONS) as pool:
                    replies = list(pool.map(lambda c: chat(lb.url, c, history[c]), range(CONVERSATIONS)))
                new = 0
                for c, r in enumerate(replies):
                    usage = r["usage"]
                    cached = usage["prompt_tokens_details"]["cached_tokens"]
                    if previous[c] is not None:      # all but the last generated token came back as a snapshot
                        assert cached == previous[c]["prompt_tokens"] + previous[c]["completion_tokens"] - 1, \
                            f"conversation {c}, turn {turn + 1}"
                    new += usage["prompt_tokens"] - cached
                    previous[c] = usage
                    message = r["choices"][0]["message"]      # the reasoning too: the next turn renders it
                    history[c].append({k: message[k] for k in ("role", "content", "reasoning_content") if k in message})
                assert sum(metric(s, "prefill", PREFILLED) for s in stacks) - prefilled == new, f"turn {turn + 1}"
                got_hits = [metric(s, "router", STORE_HITS) - h for s, h in zip(alive, hits)]
                if turn == 0:
                    served = [metric(s, "router", REQUESTS) - n for s, n in zip(alive, requests)]
                    assert all(served), f"the conversations were not spread over both routers: {served}"
                elif turn < KILL_AFTER or turn > KILL_AFTER:
                    assert got_hits == [0] * len(alive), "a turn left its router's RAM"
                else:                                # the first turn after the kill: the moved ones hit the store
                    assert got_hits == [served[0]], got_hits
                if turn == KILL_AFTER - 1:
                    wait_written(stacks[0])
                    stacks[0].procs["router"].send_signal(signal.SIGKILL)
                    stacks[0].procs["router"].wait(10)
                    alive = stacks[1:]
        finally:
            lb.stop()
