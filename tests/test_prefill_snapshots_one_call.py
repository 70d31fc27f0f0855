"""The prefill worker's snapshots come from one backend call (checkpoints inside its passes), each
what a prefill stopping there leaves; the passes over the weights are a metric."""
from __future__ import annotations

import numpy as np

from common.kv_cache import DEFAULT_KV_TYPE
from common.protocol.prefill import PrefillRequest
from common.protocol.router import Snapshot
from common.sampling import SamplingParams
from services.prefill.config import PrefillConfig
from services.prefill.server import PrefillServer
from tests.stack_helpers import write_tiny_gguf


class Decoder:
    def __init__(self):
        self.sent = []

    def put(self, msg) -> None:
        self.sent.append(msg)


def test_snapshots_of_one_call_match_prefills_that_stop_there(tmp_path):
    server = PrefillServer(PrefillConfig(str(write_tiny_gguf(tmp_path / "tiny.gguf")), router="tcp://127.0.0.1:9"))
    decoder, replies = Decoder(), []
    server.decoders.get = lambda address: decoder
    server.link.send = replies.append
    cfg, backend = server.model.config, server.backend
    ids = [int(x) for x in np.random.default_rng(0).integers(0, cfg.vocab_size, 300)]
    try:
        steps = server.progress.steps
        server.link._queue.put(PrefillRequest("r", ids, ids, 0, "tcp://d:1", SamplingParams(), 4, [], False, None, 64,
                                              DEFAULT_KV_TYPE))
        server.step(timeout=0)
        snaps = [m for m in replies if isinstance(m, Snapshot)]
        assert [s.pos for s in snaps] == [64, 128, 192, 256, 300]
        stats = backend.stats()
        assert stats["calls"] == 1 and stats["passes"] == 5      # the runner's 256-token chunks, cut at each
        assert server.progress.steps - steps >= 5
        sample = server.metrics.registry.get_sample_value
        assert sample("fermium_prefill_weight_passes_sum") == 5 and sample("fermium_prefill_weight_passes_count") == 1
        for snap in snaps:
            state = backend.runner.new_state()
            logits = backend.runner.prefill(ids[:snap.pos], state)
            n_lin = len(state.conv)
            assert all(np.array_equal(a, b) for a, b in zip(snap.recurrent, state.arrays()[:2 * n_lin]))
            assert all(np.array_equal(a, b[snap.since:snap.pos]) for a, b in zip(snap.k, state.k))
            assert all(np.array_equal(a, b[snap.since:snap.pos]) for a, b in zip(snap.v, state.v))
            np.testing.assert_array_equal(snap.logits, logits)
        np.testing.assert_array_equal(decoder.sent[-1].logits, snaps[-1].logits)
    finally:
        server.close()
