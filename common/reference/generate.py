"""The generation loop shared by `fermium generate` and the in-process tests."""
from __future__ import annotations

from typing import Iterator, Sequence

from ..sampling import Sampler, SamplingParams
from ..state import SequenceState


def generate(runner, prompt_ids: Sequence[int], params: SamplingParams, max_tokens: int,
             stop_ids: set[int] = frozenset(), state: SequenceState | None = None) -> Iterator[int]:
    """Prefill once, then decode; yields each sampled token (a stop token is yielded, then ends)."""
    state = state if state is not None else runner.new_state()
    sampler = Sampler(params)
    history = list(prompt_ids)
    logits = runner.prefill(prompt_ids, state)
    for _ in range(max_tokens):
        token = sampler.sample(logits, history)
        history.append(token)
        yield token
        if token in stop_ids:
            return
        logits = runner.decode([token], [state])[0]
