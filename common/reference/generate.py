"""The generation loop of `fermium generate` and of tests: prefill once, then decode, ending as
common.generation.GenerationPolicy says, as the servers do; with a common.speculative.Speculator,
decode is its cycles (the same tokens when greedy)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

from ..generation import GenerationPolicy
from ..sampling import Sampler, SamplingParams
from ..speculative import Lane, Speculator
from ..state import SequenceState


def generate(runner, prompt_ids: Sequence[int], params: SamplingParams, max_tokens: int,
             stop_ids: Iterable[int] = frozenset(), state: SequenceState | None = None,
             policy: GenerationPolicy | None = None, speculator: Speculator | None = None) -> Iterator[int]:
    """Yields the emitted tokens: a stop token ends the loop and is not yielded. With `policy`
    (built by the caller, who may feed it text), it decides instead of max_tokens and stop_ids.
    With `speculator` (over this runner), decode drafts and verifies; it counts the drafts."""
    policy = policy or GenerationPolicy(max_tokens, stop_ids)
    state = state if state is not None else runner.new_state()
    sampler = Sampler(params, prompt_len=len(prompt_ids))
    history = list(prompt_ids)
    logits = runner.prefill(prompt_ids, state)
    if speculator is not None:
        yield from _speculative(speculator, Lane(state, sampler, history, policy, logits=logits))
        return
    while True:
        token = sampler.sample(logits, history)
        if policy.accept(token):
            history.append(token)
            yield token
        if policy.finished:
            return
        logits = runner.decode([token], [state])[0]


def _speculative(speculator: Speculator, lane: Lane) -> Iterator[int]:
    taken: list[int] = []

    def emit(lane: Lane, token: int, row) -> bool:
        lane.logits = row
        if lane.policy.accept(token):
            lane.history.append(token)
            taken.append(token)
        lane.next_token = token
        return not lane.policy.finished

    more = emit(lane, lane.sampler.sample(lane.logits, lane.history), lane.logits)
    lane.draft = speculator.start()
    while True:
        reason = lane.policy.finish_reason     # the cycle's own end (max_tokens, a stop id) keeps its tokens
        for token in taken:
            yield token
            if lane.policy.finish_reason != reason:   # a stop string the caller fed in ends it here
                return
        taken.clear()
        if not more:
            return
        settled, = speculator.step([lane], emit)
        if settled.error is not None:
            raise settled.error
        more = not settled.finished


@dataclass(frozen=True)
class Completion:
    text: str
    tokens: list[int]              # emitted
    finish_reason: str
    completion_tokens: int         # as usage counts them: a stop token too


def complete(runner, tokenizer, prompt_ids: Sequence[int], params: SamplingParams, max_tokens: int,
             stop_ids: Iterable[int] = frozenset(), stop: Iterable[str] = (),
             state: SequenceState | None = None) -> Completion:
    """One answer as the router gives it: text detokenized token by token, stop strings applied."""
    policy = GenerationPolicy(max_tokens, stop_ids, stop)
    detok, parts, tokens = tokenizer.stream(), [], []
    for token in generate(runner, prompt_ids, params, max_tokens, state=state, policy=policy):
        tokens.append(token)
        parts.append(policy.text(detok.push(token)))
    parts += [policy.text(detok.finish()), policy.flush()]
    return Completion("".join(parts), tokens, policy.finish_reason or "length", policy.generated)
