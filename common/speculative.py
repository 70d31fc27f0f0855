"""MTP self-speculative decoding: the cycle over a batch, on a runner with an MTP block.

A cycle, for the sequences of one batch (each with `next_token` x, sampled and not yet fed):
1. verify: one runner.verify call runs [x, d1..dk] for each drafting sequence, [x] for the
   others; row j of a sequence's rows gives the token after its j-th token (row 0 the token
   after x, which d1 guesses);
2. accept, row by row (common.speculative_accept): d_{j+1} against row j while they agree; the
   first rejection gives the correction from its row, and with every draft accepted row k gives
   a bonus token: accepted + 1 tokens a cycle. Each goes to `emit`, which may end the sequence
   there (a stop id, max_tokens, a stop string in the caller): then no later token is taken;
3. keep: runner.keep leaves the state after the last row whose token was taken (the rows past
   it roll back from the verify's rollback slots); the token sampled from that row is the next x,
   so a sequence ends in the state, with the logits, that decoding it one token a time gives;
4. draft: the MTP block runs the kept trunk rows, each row i as (hidden_i, the token taken from
   row i), in one runner.draft call for every drafting sequence; its last row drafts d1 of the
   next cycle; k-1 one-row calls chain the rest (token: the draft before, hidden: that row's
   hidden_out); then each DraftState.pos goes back to the kept rows, as the chained rows are
   guesses. So the MTP block's KV holds one row per decoded position, local to this decode.
The first cycle of a sequence has no hidden yet: it verifies [x] alone, then drafts.

A sequence whose drafts stop paying turns drafting off (`Drafting.record`): while off, it
decodes one token a cycle in the same batch, and keeps its trunk rows (hidden, token) for the
MTP block; after PROBE_AFTER tokens it drafts again, running those rows first, so that its MTP
KV misses no position. A sequence with a grammar never drafts (its `draft` is None).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .engine_types import SpeculativeRunner
from .errors import UserError
from .sampling import Sampler
from .speculative_accept import judge, propose, sample
from .state import DraftState, RollbackSlots

MODES = ("none", "mtp")
MAX_DRAFT_TOKENS = 3
# A cycle of k drafts costs about 1 + DRAFT_COST * k decode steps: each draft is a pass of the MTP
# block (one layer and the LM head, against a trunk of tens of layers) and a verify row that reads
# experts of its own. It emits 1 + accepted tokens, so drafting pays while accepted > DRAFT_COST * k.
DRAFT_COST = 0.3
RATE_WEIGHT = 0.25          # the newest cycle's weight in the average: about the last four cycles
PROBE_AFTER = 32            # tokens decoded one a cycle before a sequence that stopped drafting tries again
PROBE_RATE = 2 * DRAFT_COST  # per draft, the average a probe starts from: a few poor cycles end it


class SpeculationError(UserError, ValueError):
    """A speculative decoding setting the model or the runner cannot take."""


def check_settings(mode: str, draft_tokens: int, draft_vocab: int) -> None:
    if mode not in MODES:
        raise SpeculationError(f"--speculative {mode!r}: choose one of {', '.join(MODES)}")
    if not 1 <= draft_tokens <= MAX_DRAFT_TOKENS:
        raise SpeculationError(f"--draft-tokens {draft_tokens}: give 1 to {MAX_DRAFT_TOKENS}")
    if draft_vocab < 0:
        raise SpeculationError(f"--draft-vocab {draft_vocab}: give 0 (the whole vocabulary) or a token count")


def check_mtp(model: Any, runner: Any = None) -> None:
    """Raise SpeculationError unless the model file (and the runner, when given) has an MTP block."""
    cfg = model.config
    if not getattr(cfg, "n_nextn_layers", 0):
        raise SpeculationError(f"--speculative mtp needs a model with an MTP block (blk.N.nextn.*, "
                               f"{cfg.arch}.nextn_predict_layers > 0); {getattr(model, 'path', 'this model')} "
                               "has none: use --speculative none")
    if runner is not None and not getattr(runner, "has_mtp", False):
        raise SpeculationError(f"--speculative mtp: the {type(runner).__name__} runner did not bind the MTP block "
                               f"of {getattr(model, 'path', 'this model')}")


def draft_vocab_ids(model: Any, n: int) -> np.ndarray | None:
    """The draft head's token ids for --draft-vocab n (sorted int64; None: the whole vocabulary):
    the n lowest ids, which in a byte-level BPE vocabulary are the earliest merges and so about
    the most frequent tokens, and every special token (control, user-defined, unknown types) of
    the tokenizer, which end turns and open tool calls."""
    vocab = model.config.vocab_size
    if not n or n >= vocab:
        return None
    ids = set(range(n))
    if hasattr(model, "has") and model.has("tokenizer.ggml.token_type"):
        from .model.tokenizer import TOKEN_CONTROL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED
        special = (TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNKNOWN)
        ids |= {i for i, t in enumerate(model.get("tokenizer.ggml.token_type")) if int(t) in special and i < vocab}
    if hasattr(model, "has") and model.has("tokenizer.ggml.eos_token_id"):
        ids |= {int(model.get("tokenizer.ggml.eos_token_id"))} & set(range(vocab))
    return np.array(sorted(ids), np.int64)


@dataclass
class Drafting:
    """One sequence's speculation: its MTP KV, its rollback slots, the drafts of its next verify."""

    state: DraftState
    rollback: RollbackSlots
    k: int
    drafts: list[int] = field(default_factory=list)
    q: list = field(default_factory=list)          # per draft: the distribution it was drawn from, None if greedy
    pending: list = field(default_factory=list)    # (hidden (H,), token taken after it): rows the MTP block owes
    rate: float = 0.0                              # average accepted drafts per cycle (RATE_WEIGHT)
    idle: int = 0                                  # tokens left before a probe; 0 while drafting

    def __post_init__(self):
        self.rate = float(self.k)                  # optimistic until measured

    @property
    def active(self) -> bool:
        return self.idle == 0

    def record(self, drafted: int, accepted: int, emitted: int) -> None:
        """A cycle's outcome: the average of accepted drafts over cycles of k drafts; below
        DRAFT_COST * k drafting stops for PROBE_AFTER tokens."""
        if self.idle:
            self.idle = max(0, self.idle - emitted)
            if not self.idle:
                self.rate = PROBE_RATE * self.k
            return
        if drafted == self.k:
            self.rate += RATE_WEIGHT * (accepted - self.rate)
            if self.rate < DRAFT_COST * self.k:
                self.idle, self.drafts, self.q = PROBE_AFTER, [], []


@dataclass(eq=False)
class Lane:
    """A sequence as the cycle sees it, for callers without a scheduler (`fermium generate`, the
    benchmark); the decode server's scheduler.Sequence has the same fields."""

    state: Any                     # SequenceState
    sampler: Sampler
    history: list[int]             # prompt + taken tokens: the penalties' history
    policy: Any                    # common.generation.GenerationPolicy
    next_token: int = -1
    logits: Any = None             # the row next_token was sampled from
    draft: Drafting | None = None


@dataclass(frozen=True)
class Settled:
    """One sequence's cycle: the verify rows it kept, its drafts and the accepted ones, whether
    it ended (emit said so), and its sampler's error, if it raised."""

    kept: int
    drafted: int
    accepted: int
    finished: bool
    error: Exception | None = None


Emit = Callable[[Any, int, np.ndarray], bool]


class Speculator:
    """The cycle over a runner with the MTP methods (verify, keep, draft; see the module docstring).
    `judge` decides a draft (common.speculative_accept.judge, or the benchmark's forced one);
    `max_positions` bounds a sequence's positions (the context size): drafts never run past it;
    `auto_off` False keeps every sequence drafting (the benchmark measures drafting itself)."""

    def __init__(self, runner: SpeculativeRunner, k: int, *, draft_ids: np.ndarray | None = None, judge=judge,
                 max_positions: int | None = None, auto_off: bool = True):
        if not 1 <= k <= MAX_DRAFT_TOKENS:
            raise SpeculationError(f"--draft-tokens {k}: give 1 to {MAX_DRAFT_TOKENS}")
        self.runner, self.k, self.judge, self.auto_off = runner, k, judge, auto_off
        self.vocab = runner.cfg.vocab_size
        self.ids = draft_ids
        self.max_positions = max_positions or runner.cfg.context_length
        if draft_ids is not None:
            runner.set_draft_vocab(draft_ids)
        self.drafted = self.accepted = 0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def start(self) -> Drafting:
        return Drafting(self.runner.new_draft_state(), self.runner.new_rollback(self.k), self.k)

    def step(self, seqs: Sequence[Any], emit: Emit, masks: Sequence[np.ndarray | None] | None = None) -> list[Settled]:
        """One cycle of `seqs` (each with state, sampler, history, policy, next_token and draft).
        `emit(seq, token, row)` takes each token in order, `row` the logits it came from; it
        appends the token to seq.history and sets seq.next_token, and says False when the sequence
        has ended. `masks`: a grammar's allowed tokens per sequence (those never draft)."""
        masks = masks if masks is not None else [None] * len(seqs)
        tokens = [[s.next_token, *(s.draft.drafts if s.draft is not None and s.draft.active else ())]
                  for s in seqs]
        rollbacks = [s.draft.rollback if len(t) > 1 else None for s, t in zip(seqs, tokens)]
        logits, hidden = self.runner.verify(tokens, [s.state for s in seqs], rollbacks)
        out, drafting, at = [], [], 0
        for s, toks, rollback, mask in zip(seqs, tokens, rollbacks, masks):
            rows, hid = logits[at:at + len(toks)], hidden[at:at + len(toks)]
            at += len(toks)
            settled, taken = self._settle(s, toks, rows, mask, emit)
            out.append(settled)
            if settled.error is not None:
                continue
            self.runner.keep(s.state, rollback, settled.kept, len(toks))
            self.drafted += settled.drafted
            self.accepted += settled.accepted
            if settled.finished or s.draft is None:
                continue
            s.draft.pending += [(np.array(hid[i]), taken[i]) for i in range(settled.kept)]
            s.draft.drafts, s.draft.q = [], []
            if self.auto_off:
                s.draft.record(settled.drafted, settled.accepted, len(taken))
            if s.draft.active:
                drafting.append(s)
        if drafting:
            self._draft(drafting)
        return out

    def _settle(self, s: Any, toks: list[int], rows: np.ndarray, mask, emit: Emit) -> tuple[Settled, list[int]]:
        drafts, taken, accepted = toks[1:], [], 0
        q = s.draft.q if drafts else []
        try:
            for j, row in enumerate(rows):
                if j < len(drafts):
                    token, took = self.judge(s.sampler, row, s.history, drafts[j], q[j])
                else:
                    token, took = sample(s.sampler, row, s.history, mask), False
                accepted += took
                taken.append(token)
                if not emit(s, token, row):
                    return Settled(j + 1, len(drafts), accepted, True), taken
                if not took:
                    break
        except Exception as e:                      # this sequence's sampler: it alone fails
            return Settled(0, len(drafts), accepted, True, e), taken
        return Settled(len(taken), len(drafts), accepted, False), taken

    def _budget(self, s: Any) -> int:
        """Drafts worth making for the next cycle: it takes at most drafts + 1 tokens, within
        max_tokens and the context."""
        left = s.policy.max_tokens - s.policy.generated - 1
        return max(0, min(self.k, left, self.max_positions - s.state.pos - 1))

    def _draft(self, seqs: list[Any]) -> None:
        runner, dstates = self.runner, [s.draft.state for s in seqs]
        toks = [[t for _, t in s.draft.pending] for s in seqs]
        hidden = np.stack([h for s in seqs for h, _ in s.draft.pending])
        rows, h_last = (list(a) for a in runner.draft(toks, hidden, dstates, last_only=True))
        kept = [d.pos for d in dstates]
        budgets = [self._budget(s) for s in seqs]
        for s in seqs:
            s.draft.pending = []
        for c in range(max(budgets)):
            for i, s in enumerate(seqs):
                if budgets[i] > c:
                    token, q = propose(s.sampler, rows[i], s.history + s.draft.drafts, self.ids, self.vocab)
                    s.draft.drafts.append(token)
                    s.draft.q.append(q)
            chain = [i for i in range(len(seqs)) if budgets[i] > c + 1]
            if not chain:
                break
            logits, h_out = runner.draft([[seqs[i].draft.drafts[-1]] for i in chain],
                                         np.stack([h_last[i] for i in chain]), [dstates[i] for i in chain])
            for n, i in enumerate(chain):
                rows[i], h_last[i] = logits[n], h_out[n]
        for d, pos in zip(dstates, kept):
            d.pos = pos
