"""Decode worker configuration."""
from __future__ import annotations

from dataclasses import dataclass

from common.config import WorkerConfig, setting
from common.engines import AUTO, RUNNER, names_text
from common.speculative import MAX_DRAFT_TOKENS, check_settings

GRAMMAR_STEP_BUDGET_MS = 250.0      # far above a schema's mask on a 248k vocabulary (tools/bench_grammar.py)
GRAMMAR_REQUEST_BUDGET_S = 60.0


@dataclass(frozen=True)
class DecodeConfig(WorkerConfig):
    runner: str = setting(AUTO, f"Decode runner: {names_text(RUNNER)} (auto: native when it loads).",
                          aliases=("engine",))
    max_batch: int = setting(16, "Sequences per decode step.")
    capacity: int = setting(64, "Sequences held at once.")   # running + waiting
    grammar_step_budget_ms: float = setting(GRAMMAR_STEP_BUDGET_MS, "Most CPU milliseconds one grammar mask "
                                            "(the tokens a response_format allows next) may take; a request whose "
                                            "grammar takes longer fails alone while the batch goes on.", min=1)
    grammar_request_budget_s: float = setting(GRAMMAR_REQUEST_BUDGET_S, "Most CPU seconds of grammar masks one "
                                              "request may take in all, past which it fails alone.", min=0.001)
    speculative: str = setting("none", "Speculative decoding: none, or mtp (the model's MTP block drafts tokens "
                                       "that one batched step verifies; the output is unchanged). mtp needs a "
                                       "model with an MTP block.")
    draft_tokens: int = setting(2, f"Tokens drafted per step with --speculative mtp, 1 to {MAX_DRAFT_TOKENS}.",
                                min=1)
    draft_vocab: int = setting(0, "With --speculative mtp: 0 drafts over the whole vocabulary; N keeps a reduced "
                                  "draft LM head of the N most frequent tokens, taken as the N lowest ids (about "
                                  "the most frequent in a byte-level BPE vocabulary), plus every special and "
                                  "control token of the tokenizer.", min=0)

    def __post_init__(self):
        check_settings(self.speculative, self.draft_tokens, self.draft_vocab)
