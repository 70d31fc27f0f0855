"""Shared by the speculative decoding tests: a toy runner with the MTP runner methods of
issue #31 and real rollback, and the loops that decode with and without speculation."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from common.generation import GenerationPolicy
from common.sampling import Sampler
from common.speculative import Lane, Speculator
from common.state import DraftState, RollbackSlots, SequenceState


class ToyRunner:
    """A deterministic toy model in float64: a recurrent vector (the 'ssm'), the last token's
    embedding (the 'conv'), a KV cache the output attends over, and a draft block with its own KV
    whose guesses agree with the model's often, not always (`noise` lowers it). verify keeps the
    recurrent state after each row in the rollback slots; keep swaps it back, as the runners do.
    A draft state's key row is (token, hidden in) and its value row the block's output, so a test
    can read which rows the MTP block ran."""

    def __init__(self, vocab: int = 40, hidden: int = 8, seed: int = 0, noise: float = 1.0, context: int = 512):
        rng = np.random.default_rng(seed)
        self.V, self.H, self.noise = vocab, hidden, noise
        self.E = rng.normal(size=(vocab, hidden))
        self.A = rng.normal(size=(hidden, hidden)) * 0.6
        self.W = rng.normal(size=(vocab, hidden)) * 2.0
        self.cfg = SimpleNamespace(vocab_size=vocab, hidden_size=hidden, context_length=context, n_nextn_layers=1)
        self.kv_type, self.has_mtp, self.ids = "f32", True, None
        self.calls = {"verify": 0, "draft": 0, "draft_rows": 0}

    # ---- the plain runner
    def new_state(self) -> SequenceState:
        H = self.H
        return SequenceState(0, [np.zeros(H)], [np.zeros(H)], [np.zeros((0, H))], [np.zeros((0, H))])

    def _step(self, s: SequenceState, t: int) -> tuple[np.ndarray, np.ndarray]:
        e = self.E[t]
        h = np.tanh(self.A @ s.ssm[0] + e + 0.5 * s.conv[0])
        s.ssm[0], s.conv[0] = h, e.copy()
        s.k[0], s.v[0] = np.vstack([s.k[0], e]), np.vstack([s.v[0], h])
        w = np.exp(s.k[0] @ h - (s.k[0] @ h).max())
        out = h + 0.1 * (w / w.sum()) @ s.v[0]
        s.pos += 1
        return self.W @ out, h

    def prefill(self, tokens, state):
        for t in tokens:
            logits, _ = self._step(state, t)
        return logits

    def decode(self, tokens, states):
        return np.stack([self._step(s, t)[0] for t, s in zip(tokens, states)])

    # ---- the MTP runner methods
    def new_rollback(self, slots: int) -> RollbackSlots:
        return RollbackSlots([[np.zeros(self.H)] for _ in range(slots)], [[np.zeros(self.H)] for _ in range(slots)])

    def new_draft_state(self) -> DraftState:
        return DraftState(0, np.zeros((0, self.H + 1)), np.zeros((0, self.H)))

    def verify(self, tokens, states, rollbacks):
        self.calls["verify"] += 1
        logits, hidden = [], []
        for toks, s, rb in zip(tokens, states, rollbacks):
            assert len(toks) == 1 or len(rb.conv) >= len(toks) - 1
            for j, t in enumerate(toks):
                row, h = self._step(s, t)
                logits.append(row)
                hidden.append(h)
                if j < len(toks) - 1:
                    rb.conv[j][0][:], rb.ssm[j][0][:] = s.conv[0], s.ssm[0]
        return np.stack(logits), np.stack(hidden)

    def keep(self, state, rollback, rows, ran):
        assert 1 <= rows <= ran
        if rows == ran:
            return
        state.pos -= ran - rows
        state.k, state.v = [state.k[0][:state.pos]], [state.v[0][:state.pos]]
        j = rows - 1
        state.conv[0], rollback.conv[j][0] = rollback.conv[j][0], state.conv[0]
        state.ssm[0], rollback.ssm[j][0] = rollback.ssm[j][0], state.ssm[0]

    def draft(self, tokens, hidden, dstates, last_only=False):
        self.calls["draft"] += 1
        logits, h_out, r = [], [], 0
        for toks, d in zip(tokens, dstates):
            for j, t in enumerate(toks):
                self.calls["draft_rows"] += 1
                h = hidden[r]
                ctx = d.v[:d.pos].mean(axis=0) if d.pos else np.zeros(self.H)
                before = self.E[int(d.k[d.pos - 1, 0])] if d.pos else np.zeros(self.H)   # the row's own token
                u = np.tanh(self.A @ h + self.E[t] + 0.5 * before)
                d.k = np.vstack([d.k[:d.pos], np.concatenate([[t], h])])
                d.v = np.vstack([d.v[:d.pos], u])
                noise = np.random.default_rng([d.pos, t]).normal(size=self.V) * self.noise
                d.pos += 1
                row = self.W @ (u + 0.1 * ctx) + noise
                r += 1
                if last_only and j < len(toks) - 1:
                    continue
                logits.append(row if self.ids is None else row[self.ids])
                h_out.append(u)
        return np.stack(logits), np.stack(h_out)

    def set_draft_vocab(self, ids):
        self.ids = ids

    def rollback_bytes(self, slots: int) -> int:
        return self.new_rollback(slots).nbytes

    def draft_state_bytes(self, positions: int) -> int:
        return positions * (2 * self.H + 1) * 8


def plain_run(runner, prompt, params, max_tokens, stop_ids=(), stop=(), text=None, allowed=None):
    """Decode one token a step: (tokens taken, the final state, the last row sampled from)."""
    state, sampler = runner.new_state(), Sampler(params, prompt_len=len(prompt))
    policy = GenerationPolicy(max_tokens, stop_ids, stop)
    history = list(prompt)
    logits = runner.prefill(prompt, state)
    out = []
    while True:
        token = sampler.sample(logits, history, allowed)
        if policy.accept(token):
            history.append(token)
            out.append(token)
            if text:
                policy.text(text(token))
        if policy.finished:
            return out, state, logits
        logits = runner.decode([token], [state])[0]


def spec_lanes(runner, speculator: Speculator, prompts, params, max_tokens, stop_ids=(), stop=(), text=None,
               grammar=(), allowed=None):
    """Several sequences decoded together through the speculator, each ending as the policy
    says (a stop string through `text`); the indices in `grammar` never draft and sample only the
    `allowed` tokens, as a grammar's sequence. Returns, per
    sequence, (tokens taken, final state, the last row sampled from), the lanes, and the
    Settled records per cycle."""
    lanes, outs = [], []
    for i, prompt in enumerate(prompts):
        lane = Lane(runner.new_state(), Sampler(params[i], prompt_len=len(prompt)), list(prompt),
                    GenerationPolicy(max_tokens[i], stop_ids, stop))
        lane.logits = runner.prefill(prompt, lane.state)
        lane.draft = None if i in grammar else speculator.start()
        lanes.append(lane)
        outs.append([])

    def emit(lane, token, row):
        lane.logits = row
        if lane.policy.accept(token):
            lane.history.append(token)
            outs[lanes.index(lane)].append(token)
            if text:
                lane.policy.text(text(token))
        lane.next_token = token
        return not lane.policy.finished

    masks = {id(lane): allowed if i in grammar else None for i, lane in enumerate(lanes)}
    running = [lane for lane in lanes
               if emit(lane, lane.sampler.sample(lane.logits, lane.history, masks[id(lane)]), lane.logits)]
    cycles = []
    while running:
        settled = speculator.step(running, emit, [masks[id(lane)] for lane in running])
        cycles.append(settled)
        for lane, s in zip(list(running), settled):
            assert s.error is None, s.error
            if s.finished:
                running.remove(lane)
    return [(outs[i], lane.state, lane.logits) for i, lane in enumerate(lanes)], lanes, cycles


def same_state(a: SequenceState, b: SequenceState, tol: float = 0.0) -> None:
    assert a.pos == b.pos
    for x, y in zip(a.arrays(), b.arrays()):
        assert x.shape == y.shape
        np.testing.assert_allclose(x, y, rtol=tol, atol=tol)


class OracleDrafts:
    """A runner whose draft rows favour, with probability `rate`, the token that a greedy plain
    run takes there: random weights' drafts are never accepted, so this gives a real runner
    accepted runs, through its own verify, keep and draft. `oracles` are the plain runs' tokens
    (each from the first, sampled from the prompt's logits); MTP row i of a sequence holds
    token i + 1 of its run and guesses token i + 2, looked up among the runs that agree so far."""

    BOOST = 1e4

    def __init__(self, runner, oracles: list[list[int]], rate: float = 0.7, seed: int = 0):
        self.runner, self.oracles, self.rate, self.seed = runner, oracles, rate, seed
        self.seen: dict[int, list[int]] = {}           # id(DraftState) -> the tokens of its rows

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def draft(self, tokens, hidden, dstates, last_only=False):
        starts = [d.pos for d in dstates]
        logits, h_out = self.runner.draft(tokens, hidden, dstates, last_only=last_only)
        logits = np.array(logits)
        r = 0
        for toks, d, start in zip(tokens, dstates, starts):
            seen = self.seen.setdefault(id(d), [])
            del seen[start:]
            for j, t in enumerate(toks):
                seen.append(t)
                if last_only and j < len(toks) - 1:
                    continue
                i = start + j
                guess = next((o[i + 2] for o in self.oracles if len(o) > i + 2 and o[1:i + 2] == seen), None)
                if guess is not None and np.random.default_rng([self.seed, i]).random() < self.rate:
                    logits[r, guess] += self.BOOST
                r += 1
        return logits, h_out
