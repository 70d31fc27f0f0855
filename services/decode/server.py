"""The decode worker: continuous batching over the runner, tokens streamed to the router.

A DecodeRequest brings a prefilled state and the first token's logits. Its first token is
sampled on arrival (that is the time to first token); then the sequence waits for a batch
slot and decodes one token per step with the others. Each step's tokens go to the router as one
DecodeStep message, every sequence's together (outputs.py); the end goes as Finished, after
them, with the final state when it was asked for (only the KV rows the router lacks: outputs.py),
and, when the request names a prefill worker that keeps it (`hold_at`), to that worker too as
HoldState (over common.push_links), so the next turn's prompt need not carry it. Heartbeats report the
batch slots (--max-batch) that the router places sequences by.

A request with a grammar (SamplingParams.grammar) samples only the tokens it allows, the first
token too, and ends with "stop" when the grammar is complete (grammar.py). Its masks are filled
in worker threads while the batch steps (mask_ahead.py); a sequence whose mask is not ready sits
out the step holding its logits, and one whose grammar runs past --grammar-step-budget-ms or
--grammar-request-budget-s fails alone.

A request that asks for logprobs gets, with each of its tokens, the token's log-probability and
the top_logprobs most likely tokens', the first token's too, from the logits it was sampled from
as the model gave them (common.logprobs).

A request that fails the model's checks (common.protocol.checks), or whose sampler raises,
fails alone with a Failed reply; a step that raises fails its batch. Nothing a
request brings stops the loop.

With --speculative mtp (a model with an MTP block), a step is a cycle of common.speculative:
the batch's sequences verify their drafts in one runner.verify call and take 1 + accepted
tokens each, all in the cycle's DecodeStep (the logprobs of each from the row it was sampled
from); a sequence that ends inside an accepted run ends where a plain step would, with the same
state and logits. A sequence with a
grammar does not draft: it takes one token a cycle in the same verify.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from common.config import ContextModel, plan_context, reserve_context
from common.engine_types import Runner
from common.engines import load_runner
from common.generation import GenerationPolicy
from common.grammar import GrammarError
from common.kv_cache import check_same_kv_type
from common.logprobs import token_logprobs
from common.metrics import DecodeMetrics
from common.model.gguf_file import GGUFModel
from common.protocol.checks import check_decode
from common.protocol.decode import DecodeRequest
from common.protocol.prefill import HoldState
from common.push_links import PushLinks
from common.sampling import Sampler
from common.speculative import Speculator, check_mtp, draft_vocab_ids
from common.state import state_bytes
from common.worker import WorkerServer

from .config import DecodeConfig
from .grammar import Grammars
from .outputs import StepOutputs, final
from .scheduler import BatchScheduler, Sequence

log = logging.getLogger("fermium.decode")
MAX_HOLDERS = 8            # prefill workers holding states that one decode worker sends them to
IDLE_HOLDER_S = 120.0
MASK_NAP_S = 0.02          # the loop's wait for a grammar mask when no sequence can step (messages still come)


class DecodeServer(WorkerServer):
    ROLE, REQUEST = "decode", DecodeRequest

    def __init__(self, cfg: DecodeConfig, *, model=None, runner: Runner | None = None, tokenizer=None):
        """`model` (anything with GGUFModel's .config and .path) and `runner`, when given, are
        used instead of loading cfg.model and cfg.runner: the in-process stack hands in its own.
        `tokenizer` is the vocabulary grammars are built on, when not the model file's."""
        model = model if model is not None else GGUFModel(cfg.model)
        speculative = cfg.speculative == "mtp"
        if speculative:
            check_mtp(model)
        # before the runner maps it
        self.memory = plan_context("decode", model, cfg.ctx_size, cfg.max_batch, kv_type=cfg.kv_type,
                                   draft_tokens=cfg.draft_tokens if speculative else 0)
        self.ctx_size, self.kv_type = self.memory.tokens, self.memory.kv_type
        self.runner: Runner
        self.runner_name, self.runner = (("given", runner) if runner is not None
                                         else load_runner(cfg.runner, model, kv_type=self.kv_type))
        check_same_kv_type(getattr(self.runner, "kv_type", "f32"), self.kv_type, "the runner", "decode")
        reserve_context(self.runner, self.ctx_size)
        self.speculator = None
        if speculative:
            check_mtp(model, self.runner)
            self.speculator = Speculator(self.runner, cfg.draft_tokens, max_positions=self.ctx_size,
                                         draft_ids=draft_vocab_ids(model, cfg.draft_vocab))
        log.info("decode: %s", self.memory.describe(cfg.max_batch))       # once nothing has refused to start
        self.sched = BatchScheduler(cfg.max_batch)
        super().__init__(cfg, ContextModel(model, self.ctx_size), DecodeMetrics(), capacity=cfg.capacity,
                         slots=cfg.max_batch)
        self.holders = PushLinks("decode", MAX_HOLDERS, IDLE_HOLDER_S)
        self.out = StepOutputs(self.link)
        self.grammars = Grammars(model, model.config.vocab_size, self.metrics, tokenizer, workers=cfg.max_batch,
                                 step_budget_s=cfg.grammar_step_budget_ms / 1000,
                                 request_budget_s=cfg.grammar_request_budget_s)

    def load(self) -> tuple[int, int]:
        return len(self.sched.running), len(self.sched.waiting)

    def start(self) -> None:
        super().start()
        self.grammars.start()
        spec = ""
        if self.speculator is not None:
            vocab = f", draft vocabulary {len(self.speculator.ids)}" if self.speculator.ids is not None else ""
            spec = f", speculative mtp with {self.cfg.draft_tokens} draft tokens{vocab}"
        log.info("decode runner: %s, max batch %d, KV cache %s%s", self.runner_name, self.cfg.max_batch, self.kv_type,
                 spec)

    # ---- messages
    def _take(self, timeout: float) -> None:
        super()._take(timeout)
        self._gauges()

    def receive(self, msg: DecodeRequest) -> None:
        if msg.rid in self.cancelled:
            self.metrics.requests.labels("cancelled").inc()
            return
        try:
            self._admit(msg)
        except ValueError as e:                     # the request's fault
            self.metrics.protocol_error("invalid")
            self._reject(msg.rid, f"decode rejected the request: {e}")
        except Exception as e:
            self._reject(msg.rid, f"decode rejected the request: {type(e).__name__}: {e}", trace=True)

    def _reject(self, rid: str, why: str, *, trace: bool = False) -> None:
        self._complain("%s: %s", rid[:40], why, exc_info=trace)
        self.metrics.requests.labels("error").inc()
        self.out.fail(rid, why)

    def cancel(self, rid: str) -> None:
        self.cancelled.add(rid)
        seq = self.sched.cancel(rid)
        if seq is not None:
            self.grammars.pool.abandon(seq.ahead)
            self._finish(seq, "cancelled", retire=False)

    def _admit(self, req: DecodeRequest) -> None:
        if any(s.rid == req.rid for s in (*self.sched.running, *self.sched.waiting)):
            raise ValueError(f"it holds request {req.rid[:40]!r} already")
        state, params = check_decode(req, self.model.config, self.kv_type)
        seq = Sequence(req.rid, state, Sampler(params, prompt_len=len(req.history)), list(req.history),
                       GenerationPolicy(req.max_tokens, req.stop_ids), req.return_state, hold_at=req.hold_at,
                       since=req.since)
        seq.logits = np.asarray(req.logits)
        seq.ahead = self.grammars.ahead(params.grammar)
        if seq.ahead is not None:                   # its first token waits for the first mask
            seq.matcher, seq.parked = seq.ahead.matcher, True
            self.sched.add(seq)
            return
        if self.speculator is not None:
            seq.draft = self.speculator.start()
        if self._accept(seq, seq.sampler.sample(seq.logits, seq.history, None)):
            self.sched.add(seq)
            self.metrics.held(len(self.sched))
        else:
            self._finish(seq, seq.policy.finish_reason, retire=False)

    # ---- tokens
    def _accept(self, seq: Sequence, token: int) -> bool:
        """Record a sampled token, as common.generation says; False when the sequence is finished."""
        self.metrics.tokens.inc()
        if seq.policy.accept(token):
            seq.history.append(token)
            params = seq.sampler.params
            self.out.token(seq.rid, token, token_logprobs(seq.logits, token, params.top_logprobs)
                           if params.logprobs else None)
            if seq.matcher is not None:
                seq.matcher.consume(token)
                if seq.matcher.done and not seq.policy.finished:      # nothing but EOS can follow
                    seq.policy.finish_reason = "stop"
        if seq.policy.finished:
            return False
        seq.next_token = token
        if seq.ahead is not None:                   # the next mask, while the batch steps
            self.grammars.pool.submit(seq.ahead)
        return True

    def _finish(self, seq: Sequence, reason: str, *, retire: bool = True) -> None:
        if retire:
            self.sched.retire(seq)
        self.metrics.requests.labels(reason).inc()
        keep = seq.return_state and reason != "cancelled"
        end = final(seq, self.link.worker_id, reason, keep)
        self.out.end(end)
        if not keep:
            return
        self.metrics.state_bytes.labels("router").inc(end.state_bytes())
        if seq.hold_at:                             # the prefill worker holds no part of it: all of it
            pos, state = seq.state.pos, seq.state.arrays()
            self.holders.get(seq.hold_at).put(HoldState(seq.rid, self.link.worker_id, pos, seq.history[:pos], state,
                                                        self.kv_type, seq.state.rope_delta))
            self.metrics.state_bytes.labels("prefill").inc(state_bytes(state))

    def step(self, timeout: float = 0.05) -> None:
        self._take(timeout if not len(self.sched) else 0)
        self.holders.reap()
        self.sched.admit()
        spec = self.speculator is not None
        self.grammars.pool.mark()
        self.grammars.turns([*self.sched.running, *self.sched.waiting], spec, self._sample_one, self._drop)
        self.out.flush()                            # first tokens and failures go before the step runs
        batch = [s for s in self.sched.running if self.grammars.can_step(s, spec)]
        if not batch:
            if len(self.sched):                     # every sequence waits for its grammar's mask
                self.grammars.pool.wait(MASK_NAP_S)
            return
        try:
            self._run(batch, spec)
        finally:
            self.out.flush()                        # the step's tokens as one DecodeStep, then its ends
        self._gauges()

    def _run(self, batch: list[Sequence], spec: bool) -> None:
        t0 = time.perf_counter()
        try:
            if spec:                                # a cycle: the tokens are taken between its verify and draft
                masks = [s.mask for s in batch]
                for s in batch:
                    s.mask = None
                settled = self.speculator.step(batch, self._emit, masks)
            else:
                logits = self.runner.decode([s.next_token for s in batch], [s.state for s in batch])
        except Exception as e:
            log.exception("decode step failed for %d sequences", len(batch))
            for seq in batch:
                self.sched.retire(seq)
                self.metrics.requests.labels("error").inc()
                self.out.fail(seq.rid, f"decode step failed: {type(e).__name__}: {e}")
            return
        self.metrics.step_time.observe(time.perf_counter() - t0)
        self.metrics.batch_size.observe(len(batch))
        if self.speculator is not None:
            self._settle(batch, settled)
        else:
            self._sample(batch, logits)

    def _sample(self, batch: list[Sequence], logits: np.ndarray) -> None:
        for seq, row in zip(batch, logits):
            seq.logits = row
            if seq.ahead is None:
                self._sample_one(seq, None)
            elif (allowed := self.grammars.take(seq, self._drop)) is not None:
                self._sample_one(seq, allowed)
            elif seq.ahead is not None:                     # not failed: it samples once the mask comes
                seq.parked = True

    def _sample_one(self, seq: Sequence, allowed: np.ndarray | None) -> None:
        try:
            more = self._accept(seq, seq.sampler.sample(seq.logits, seq.history, allowed))
        except GrammarError as e:                           # the output left its grammar
            self._drop(seq, str(e))
            return
        except Exception as e:                              # this sequence's sampler: it alone fails
            self._drop(seq, f"sampling failed: {type(e).__name__}: {e}", trace=True)
            return
        if not more:
            self.sched.cancel(seq.rid)
            self._finish(seq, seq.policy.finish_reason, retire=False)

    def _drop(self, seq: Sequence, why: str, *, trace: bool = False) -> None:
        self.sched.cancel(seq.rid)
        self.grammars.pool.abandon(seq.ahead)
        seq.ahead = None
        self._reject(seq.rid, why, trace=trace)

    def _emit(self, seq: Sequence, token: int, row: np.ndarray) -> bool:
        """A token that a speculative cycle took (common.speculative), from logits `row`."""
        seq.logits = row
        return self._accept(seq, token)

    def _settle(self, batch: list[Sequence], settled: list) -> None:
        """After a speculative cycle: its drafts counted, the sequences it ended finished."""
        for seq, done in zip(batch, settled):
            self.metrics.speculation(done.drafted, done.accepted)
            if done.error is not None:                      # this sequence's sampler: it alone fails
                self.sched.retire(seq)
                self._reject(seq.rid, f"sampling failed: {type(done.error).__name__}: {done.error}", trace=True)
            elif done.finished:
                self._finish(seq, seq.policy.finish_reason)

    def _gauges(self) -> None:
        self.metrics.running.set(len(self.sched.running))
        self.metrics.waiting.set(len(self.sched.waiting))

    def close(self) -> None:
        super().close()
        self.holders.close()
        self.grammars.pool.close()
