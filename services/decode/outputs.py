"""What the decode loop sends the router at each flush: every sequence's new tokens as one
DecodeStep (common.protocol.router, vLLM's EngineCoreOutputs), then the ends (Finished, or a
failure) in the order they came, so a sequence's tokens always reach the router before its end.
The loop flushes once a step, and once before it for what arrived (first tokens, failures).
A Finished carries of the final state only what the router lacks (`final`)."""
from __future__ import annotations

import numpy as np

from common.protocol.router import MAX_STEP_SEQUENCES, DecodeStep, Finished, Tokens
from common.worker import WorkerLink

from .scheduler import Sequence


class StepOutputs:
    def __init__(self, link: WorkerLink):
        self.link = link
        self.seqs: dict[str, tuple[list, list, list, list]] = {}   # rid -> tokens, logprobs, top_ids, top_logprobs
        self.ends: list[Finished | tuple[str, str]] = []           # a Finished, or (rid, error) of a failure

    def token(self, rid: str, token: int, logprobs: tuple[float, list[int], list[float]] | None) -> None:
        """`logprobs`: the token's, and the top ones' ids and log-probabilities (common.logprobs)."""
        tokens, chosen, top_ids, top_logprobs = self.seqs.setdefault(rid, ([], [], [], []))
        tokens.append(token)
        if logprobs is not None:
            chosen.append(logprobs[0])
            top_ids.extend(logprobs[1])
            top_logprobs.extend(logprobs[2])

    def end(self, msg: Finished) -> None:
        self.ends.append(msg)

    def fail(self, rid: str, error: str) -> None:
        self.ends.append((rid, error))

    def flush(self) -> None:
        seqs = [Tokens(rid, *lists) for rid, lists in self.seqs.items()]
        for i in range(0, len(seqs), MAX_STEP_SEQUENCES):
            self.link.send(DecodeStep("", self.link.worker_id, seqs[i:i + MAX_STEP_SEQUENCES]))
        for end in self.ends:
            if isinstance(end, tuple):
                self.link.fail(*end)
            else:
                self.link.send(end)
        self.seqs, self.ends = {}, []


def final(seq: Sequence, worker_id: str, reason: str, keep: bool) -> Finished:
    """The end of `seq`; with `keep`, its state at its position as the router lacks it: the
    recurrent arrays, the K and V rows past seq.since (views: the sequence is retired) and the
    logits its last token was sampled from."""
    state = seq.state
    recurrent = k = v = logits = None
    if keep:
        recurrent = [*state.conv, *state.ssm]
        k, v = [a[seq.since:state.pos] for a in state.k], [a[seq.since:state.pos] for a in state.v]
        logits = np.asarray(seq.logits, np.float32)
    return Finished(seq.rid, worker_id, reason, seq.policy.generated, state.pos, seq.since, recurrent, k, v, logits,
                    state.kv_type, state.rope_delta)
