"""The snapshot disk tier under SIGKILL and damage.

A child process runs the router's write path (a SnapshotStore with a disk_dir, fed the states
that the reference model reaches over seeded token sequences, a snapshot every STEP tokens)
and resumes, at each start, from the longest snapshot that it finds on disk. It is SIGKILLed
in mid-write (while one of its temporary files exists) KILLS times, and restarted each time on
the same directory. Then each header field of the stored files is damaged. Shown: no file is
ever partial or wrong, a dead writer's temporary files are gone after a restart, every damaged
file is refused and removed, and a generation that starts from a hit gives the cold tokens.
The same for a real router in a running stack, SIGKILLed ROUTER_KILLS times in mid-write under
4 concurrent requests: its files are whole, and the answers that start from them are the cold ones.
"""
from __future__ import annotations

import random
import select
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from common.kv_cache import DEFAULT_KV_TYPE
from common.model.gguf_file import GGUFModel
from common.model.tokenizer import Tokenizer
from common.reference.generate import generate
from common.reference.model import ReferenceModel
from common.sampling import Sampler, SamplingParams
from common.snapshots import SnapshotStore, disk
from common.snapshots.keys import chain, tail_key
from fermium.stack import Stack, free_port
from services.router.engine.prefix_cache import model_folder
from tests.snapshot_damage import DAMAGES, HEADER_DAMAGES
from tests.stack_helpers import write_tiny_gguf

ROOT = Path(__file__).resolve().parents[1]
KILLS = 20                   # kills that land in mid-write
MAX_LIVES = 80               # a kill can miss the write it aimed at; this many tries in all
MISSED_WRITES = 20           # writes a kill may wait past for one caught under way
LENGTH, STEP, BLOCK = 512, 16, 64
BUDGET = 1 << 20             # small: the child's RAM tier evicts, and reloads from disk
MAX_TOKENS = 8
START_TIMEOUT_S = 30
READY_TIMEOUT_S = 60
ROUTER_KILLS, MAX_ROUTER_KILLS = 20, 40
SAVED = "fermium_snapshot_tokens_saved_total"
# The child's states and the uninterrupted run's are the same numpy computation on the same
# inputs; the tolerance only allows for a BLAS that splits its work another way.
STATE_ATOL = 1e-5
CHILD = f"""
import sys
import numpy as np
from common.reference.model import ReferenceModel
from common.model.gguf_file import GGUFModel
from common.snapshots import SnapshotStore
model = GGUFModel(sys.argv[1])
reference = ReferenceModel(model)
store = SnapshotStore(model.config, {BUDGET}, block={BLOCK}, disk_dir=sys.argv[2])
k = 0
while True:
    tokens = np.random.default_rng(k).integers(0, 256, {LENGTH}).tolist()
    found = store.lookup(tokens)
    state = found[0] if found else reference.new_state()
    if state.pos < {LENGTH}:
        break
    k += 1
print(k, state.pos, flush=True)
while True:
    tokens = np.random.default_rng(k).integers(0, 256, {LENGTH}).tolist()
    for p in range(state.pos, {LENGTH}, {STEP}):
        logits = reference.prefill(tokens[p:p + {STEP}], state)
        store.put(tokens[:p + {STEP}], state, logits)
    k, state = k + 1, reference.new_state()
"""


def sequence(k: int) -> list[int]:
    return np.random.default_rng(k).integers(0, 256, LENGTH).tolist()


def key_of(tokens: list[int]) -> str:
    blocks = list(chain(tokens, BLOCK))
    return tail_key(blocks[-1] if blocks else b"\0" * 16, tokens[len(blocks) * BLOCK:]).hex()


class Reference:
    """The uninterrupted run: the state at every STEP of every sequence, and cold generations."""

    def __init__(self, reference: ReferenceModel):
        self.reference, self.states, self.where = reference, {}, {}

    def cover(self, k: int) -> None:
        if any(kk == k for kk, _ in self.states):
            return
        tokens, state = sequence(k), self.reference.new_state()
        for p in range(0, LENGTH, STEP):
            logits = self.reference.prefill(tokens[p:p + STEP], state)
            self.states[k, p + STEP] = (state.copy(), logits.copy())
            self.where[key_of(tokens[:p + STEP])] = (k, p + STEP)

    def cold(self, tokens: list[int]) -> list[int]:
        return list(generate(self.reference, tokens, SamplingParams(), MAX_TOKENS))

    def from_hit(self, tokens: list[int], state, logits: np.ndarray) -> list[int]:
        """Greedy tokens after a hit on the whole prompt: its logits stand in for the prefill."""
        sampler, history, out = Sampler(SamplingParams()), list(tokens), []
        for _ in range(MAX_TOKENS):
            token = sampler.sample(logits, history)
            history.append(token)
            out.append(token)
            logits = self.reference.decode([token], [state])[0]
        return out


def stored(snap_dir: Path, ref: Reference) -> dict[tuple[int, int], Path]:
    """(sequence, position) -> file, each checked whole against the uninterrupted run."""
    out = {}
    for path in snap_dir.glob("*.snap"):
        header, arrays = disk.read_checked(path)          # raises on a partial or damaged file
        k = 0
        while path.stem not in ref.where:
            ref.cover(k)
            k += 1
        where = ref.where[path.stem]
        state, logits = ref.states[where]
        assert header["pos"] == where[1]
        for got, want in zip(arrays, [*state.arrays(), logits]):
            np.testing.assert_allclose(got, want, rtol=0, atol=STATE_ATOL)
        out[where] = path
    return out


def resume_point(files: dict[tuple[int, int], Path]) -> tuple[int, int]:
    """Where the child must resume: the first sequence not yet whole, at its longest snapshot."""
    k = 0
    while (k, LENGTH) in files:
        k += 1
    return k, max((p for kk, p in files if kk == k), default=0)


def complete(stack: Stack, prompt: str) -> str:
    """The text, or "" where the router was killed under the request."""
    try:
        r = httpx.post(f"{stack.url}/v1/completions", timeout=60, json={
            "model": "fermium", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0})
        return r.json()["choices"][0]["text"]
    except (httpx.HTTPError, KeyError, ValueError):
        return ""


def metric(port: int, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def restart_router(stack: Stack) -> None:
    stack.start("router")
    deadline = time.monotonic() + READY_TIMEOUT_S          # the workers re-register by heartbeat
    while time.monotonic() < deadline:
        try:
            if len(stack.health()["workers"]) == 2:
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(0.1)
    raise TimeoutError("the workers did not come back to the restarted router")


def live_tmp(snap_dir: Path) -> set[str]:
    return {p.name for p in snap_dir.glob(disk.TMP_GLOB)}


def written(snap_dir: Path) -> set[str]:
    """The keys of the whole snapshot files in the directory."""
    return {p.stem for p in snap_dir.glob("*.snap")}


def kill_in_mid_write(child: subprocess.Popen, snap_dir: Path, nth: int, rng: random.Random) -> bool:
    """SIGKILL the child while its nth write (or, on a busy machine, a later one) is seen under
    way; True if a temporary file was left behind, that is, the kill landed in mid-write."""
    before, seen = written(snap_dir), set()
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        live = live_tmp(snap_dir)
        # a write that began and ended between two polls still counts, by the file it left
        seen |= {name.split(".")[0] for name in live} | (written(snap_dir) - before)
        if len(seen) >= nth and (live or len(seen) >= nth + MISSED_WRITES):
            break
        assert child.poll() is None, "the writer died by itself"
        assert time.monotonic() < deadline, f"the writer wrote {len(seen)} files, not {nth}"
    until = time.perf_counter() + rng.uniform(0, 1e-4)
    while time.perf_counter() < until:
        pass
    child.send_signal(signal.SIGKILL)
    assert child.wait(10) == -signal.SIGKILL
    return bool(live_tmp(snap_dir))


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    """The directory after the kills, with the uninterrupted run to check it against."""
    root = tmp_path_factory.mktemp("crash")
    model_path = write_tiny_gguf(root / "tiny.gguf", context=LENGTH + 64)
    snap_dir = root / "snapshots"
    ref = Reference(ReferenceModel(GGUFModel(model_path)))
    rng = random.Random(0)
    mid_write = lives = 0
    while mid_write < KILLS or len(list(snap_dir.glob("*.snap"))) < 3 * len(DAMAGES):
        assert lives < MAX_LIVES, f"only {mid_write} of {lives} kills landed in mid-write"
        files = stored(snap_dir, ref) if snap_dir.exists() else {}
        orphans = live_tmp(snap_dir) if snap_dir.exists() else set()
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(model_path), str(snap_dir)], cwd=ROOT,
                                 stdout=subprocess.PIPE, text=True)
        assert select.select([child.stdout], [], [], START_TIMEOUT_S)[0], "the writer did not start"
        k, pos = map(int, child.stdout.readline().split())
        assert (k, pos) == resume_point(files)          # it found the longest snapshot, whole
        assert not orphans & live_tmp(snap_dir)          # and removed the dead writer's files
        mid_write += kill_in_mid_write(child, snap_dir, rng.randint(1, 12), rng)
        lives += 1
    print(f"\nwriter: {mid_write} of {lives} SIGKILLs landed in mid-write")
    return model_path, snap_dir, ref, stored(snap_dir, ref)


def test_sigkill_in_mid_write_leaves_only_whole_files(crashed):
    model_path, snap_dir, ref, files = crashed
    assert len(files) >= 3 * len(DAMAGES)
    store = SnapshotStore(GGUFModel(model_path).config, BUDGET, block=BLOCK, disk_dir=snap_dir)
    assert store.stats.disk_rejected == 0 and len(store.snaps) == len(files)
    assert not live_tmp(snap_dir)


def test_every_damaged_field_is_refused_and_a_hit_gives_the_cold_tokens(crashed):
    """Each damage goes to its own file, whose previous snapshot (STEP tokens earlier) is left
    whole: the lookup of the damaged file's prefix must fall back to that one."""
    model_path, snap_dir, ref, files = crashed
    slots = sorted((k, p) for k, p in files if p > STEP and (k, p - STEP) in files and (p // STEP) % 2 == 0)
    assert len(slots) >= len(DAMAGES)
    damaged = dict(zip(DAMAGES, slots))
    for name, where in damaged.items():
        DAMAGES[name](files[where])
    store = SnapshotStore(GGUFModel(model_path).config, BUDGET, block=BLOCK, disk_dir=snap_dir)
    assert store.stats.disk_rejected == len(HEADER_DAMAGES)
    for name, (k, p) in damaged.items():
        tokens = sequence(k)[:p]
        state, logits = store.lookup(tokens)
        assert state.pos == p - STEP, name
        want_state, want_logits = ref.states[k, p - STEP]
        for got, want in zip([*state.arrays(), logits], [*want_state.arrays(), want_logits]):
            np.testing.assert_allclose(got, want, rtol=0, atol=STATE_ATOL, err_msg=name)
        warm = list(generate(ref.reference, tokens[state.pos:], SamplingParams(), MAX_TOKENS, state=state))
        assert warm == ref.cold(tokens), name
        assert not files[k, p].exists(), name
        state, logits = store.lookup(tokens[:p - STEP])                   # a hit on the whole prompt
        assert state.pos == p - STEP
        assert ref.from_hit(tokens[:p - STEP], state, logits) == ref.cold(tokens[:p - STEP]), name
    assert store.stats.disk_rejected == len(DAMAGES)
    left = stored(snap_dir, ref)
    assert sorted(left) == sorted(set(files) - set(damaged.values()))


def test_a_router_killed_in_mid_write_restarts_on_whole_files(tmp_path):
    """The real router, SIGKILLed while it writes a snapshot under 4 concurrent requests, then
    restarted on the same directory: its files are whole, and the answers that now start from
    them are the cold ones."""
    model_path = write_tiny_gguf(tmp_path / "tiny.gguf", context=1024)
    model = GGUFModel(model_path)
    tok, reference = Tokenizer.from_gguf(model), ReferenceModel(model, kv_type=DEFAULT_KV_TYPE)   # the stack's
    snap_root, rng = tmp_path / "snapshots", random.Random(1)
    snap_dir = model_folder(snap_root, model.fingerprint, DEFAULT_KV_TYPE)   # each model's and type's own folder
    ports = {"router": free_port()}
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "then", "ran", "far", "away", "home"]
    prompts = [" ".join(rng.choice(words) for _ in range(60)) for _ in range(4 * MAX_ROUTER_KILLS)]
    extra = {"router": ["--snapshot-dir", str(snap_root), "--snapshot-every", str(BLOCK)]}
    with Stack(str(model_path), port=free_port(), runner="reference", metrics_ports=ports, log_dir=tmp_path,
               extra=extra) as stack:
        stack.wait_ready(READY_TIMEOUT_S)
        kills = mid_write = 0
        while mid_write < ROUTER_KILLS:
            assert kills < MAX_ROUTER_KILLS, f"only {mid_write} of {kills} kills landed in mid-write"
            with ThreadPoolExecutor(4) as pool:
                for p in prompts[4 * kills:4 * kills + 4]:
                    pool.submit(complete, stack, p)
                mid_write += kill_in_mid_write(stack.procs["router"], snap_dir, rng.randint(1, 4), rng)
                kills += 1
            for path in snap_dir.glob("*.snap"):
                disk.read_checked(path)                  # whole, never partial
            orphans = live_tmp(snap_dir)
            restart_router(stack)
            assert not orphans & live_tmp(snap_dir)
        print(f"\nrouter: {mid_write} of {kills} SIGKILLs landed in mid-write")
        on_disk = 0
        for p in prompts[:4 * kills]:
            ids = tok.encode(p)
            cold = tok.decode([t for t in generate(reference, ids, SamplingParams(), MAX_TOKENS, tok.eos_ids)
                               if t not in tok.eos_ids])
            stored_at = [n for n in range(1, len(ids) + 1) if (snap_dir / f"{key_of(ids[:n])}.snap").exists()]
            saved = metric(ports["router"], SAVED)
            assert complete(stack, p) == cold
            if stored_at:                                # what the killed routers stored is used
                on_disk += 1
                assert metric(ports["router"], SAVED) - saved >= max(stored_at)
        assert on_disk, "no prompt's snapshot was on disk"
