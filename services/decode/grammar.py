"""Decode's side of structured output: a grammar matcher per sequence, the batch's masks.

A request whose SamplingParams.grammar is set gets a common.grammar.Matcher on admission, held
in a mask_ahead.Ahead: each mask is filled by a worker thread ahead of need, timed against the
budgets, and applied to the sequence's logits when ready; the sampled token then advances the
matcher, and a complete grammar ends the sequence with "stop". A sequence without a grammar is
not touched.

The tokenizer side (common.grammar.engine_tokenizer) is built once, in a thread at startup, from
the tokenizer handed in or else the model file's vocabulary; without either, grammars are refused.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import numpy as np

from common import grammar
from common.model.tokenizer import Tokenizer, TokenizerError

from .mask_ahead import Ahead, MaskPool

log = logging.getLogger("fermium.decode")


class Grammars:
    def __init__(self, model: Any, n_vocab: int, metrics: Any, tokenizer: Any = None, *, workers: int = 4,
                 step_budget_s: float = 0.25, request_budget_s: float = 60.0):
        self.n_vocab, self.metrics = n_vocab, metrics
        self.pool = MaskPool(n_vocab, workers, step_budget_s, request_budget_s, metrics)
        self._model, self._given = model, tokenizer
        self._tokenizer: Any = None
        self._why_not = ""
        self._built = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Build the tokenizer side off the compute loop; a first grammar request waits for it."""
        self._thread = threading.Thread(target=self._build, name="decode-grammar-tokenizer", daemon=True)
        self._thread.start()

    def _build(self) -> None:
        try:
            model = self._model
            if self._given is None and not (hasattr(model, "has") and model.has("tokenizer.ggml.tokens")):
                self._why_not = "the model file has no tokenizer, which a grammar needs"
                return
            t0 = time.perf_counter()
            vocab = self._given if self._given is not None else Tokenizer.from_gguf(model)
            grammar.engine_tokenizer(vocab, self.n_vocab)
            self._tokenizer = vocab
            log.info("decode: grammar tokenizer of %d tokens ready in %.2f s", vocab.vocab_size,
                     time.perf_counter() - t0)
        except (TokenizerError, ValueError) as e:
            self._why_not = f"the model's tokenizer cannot take a grammar: {e}"
        except Exception as e:                  # nothing here may stop the server from serving plain text
            log.exception("decode: grammar tokenizer failed")
            self._why_not = f"the grammar tokenizer failed: {type(e).__name__}: {e}"
        finally:
            self._built.set()

    def ahead(self, spec: str) -> Ahead | None:
        """matcher()'s, with its first mask started."""
        m = self.matcher(spec)
        if m is None:
            return None
        ahead = Ahead(m)
        self.pool.submit(ahead)
        return ahead

    def matcher(self, spec: str) -> grammar.Matcher | None:
        """A matcher for a request's grammar spec, None when it has none; a ValueError when the
        spec or this model cannot take it (the request's fault)."""
        if not spec:
            return None
        if self._thread is None and not self._built.is_set():     # not started: build it here
            self._build()
        self._built.wait()
        if self._tokenizer is None:
            raise grammar.GrammarError(f"grammar: {self._why_not}")
        return grammar.Matcher(spec, grammar.engine_tokenizer(self._tokenizer, self.n_vocab))

    # ---- each step
    def take(self, seq: Any, drop: Callable[[Any, str], None]) -> np.ndarray | None:
        """The sequence's next mask once ready; None while it is filled, or when the grammar failed
        (a budget passed, or the engine refused): `drop(seq, why)` then ends it alone."""
        try:
            return self.pool.poll(seq.ahead)
        except grammar.GrammarError as e:
            drop(seq, str(e))
            return None

    def turns(self, seqs: list, speculative: bool, sample: Callable[[Any, np.ndarray], None],
              drop: Callable[[Any, str], None]) -> None:
        """Parked sequences whose mask came `sample` their token with it (in a speculative cycle,
        every grammar sequence takes its mask for the cycle); those past a budget are dropped."""
        for seq in seqs:
            if seq.ahead is None or seq.ahead.job is None or not (seq.parked or speculative):
                continue
            allowed = self.take(seq, drop)
            if allowed is None:
                continue
            if seq.parked:
                seq.parked = False
                sample(seq, allowed)
            else:
                seq.mask = allowed

    @staticmethod
    def can_step(seq: Any, speculative: bool) -> bool:
        """Whether the sequence joins this step: not parked, and in a cycle, with its mask."""
        return not seq.parked and (not speculative or seq.ahead is None or seq.mask is not None)
