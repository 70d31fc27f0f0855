"""Token sampling: logit bias, penalties, greedy, temperature, top-k, top-p, min-p, seed.

The order is OpenAI's and vLLM's: `logit_bias` is added to the model's logits; then the
repetition penalty (over the prompt and the answer) and the presence and frequency penalties
(over the answer only, `logits[t] -= presence * (count[t] > 0) + frequency * count[t]`) apply;
then temperature, top-k, min-p and top-p shape the distribution drawn from. Each of the sparse
steps touches only the tokens it names.

Any finite parameters in range give a token, never NaN or an exception: a NaN logit is never
picked, the logits are clipped before the max is taken off and the temperature divides, so a
tiny temperature or penalty overflows only to -inf, and a distribution with nothing left in it
falls back to the argmax. A grammar's `allowed` mask (common.grammar) keeps the draw, and the
fallback, to the tokens it allows.

A seed makes a sequence's draws repeatable. The copies of one request (`n` > 1) sample with
`params.for_choice(i)`, whose seed is seed + i as vLLM gives its copies: each copy has its own
stream, and the same request with the same seed repeats every copy.

Log-probabilities are reported from the raw logits, not from what this module draws from
(common.logprobs).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .config import setting

LOGIT_LIMIT = 1e30              # far beyond any real logit, far from float64's overflow
MAX_GRAMMAR_CHARS = 1 << 18     # well inside the header slack of a wire message (common.state)
MAX_TOP_LOGPROBS = 20           # OpenAI's bound on top_logprobs
MAX_LOGIT_BIAS = 1024           # entries of logit_bias; keeps a request's header small
PENALTY_RANGE = 2.0             # OpenAI's bound on presence_penalty and frequency_penalty
BIAS_RANGE = 100.0              # OpenAI's bound on a logit_bias value
TOP_P_CANDIDATES = 64           # the first candidate set top-p sorts; it grows eightfold until it covers top_p
SEED_MODULUS = 2 ** 63          # a seed travels as an int64


@dataclass(frozen=True)
class SamplingParams:
    """How one sequence samples; it travels as a typed field of the wire's requests (common.protocol),
    and a value it refuses there is a ProtocolError."""

    temperature: float = setting(0.0, "0 is greedy.", min=0.0)
    top_k: int = setting(0, "Sample from the k most likely tokens; 0 is off.", min=0)
    top_p: float = setting(1.0, "Sample from the fewest tokens whose probabilities reach top_p.")
    min_p: float = setting(0.0, "Drop tokens less likely than min_p times the most likely one.")
    repetition_penalty: float = setting(1.0, "Penalty on the logits of tokens already in the history.")
    seed: int | None = setting(None, "Seed for sampling.")
    # a grammar spec from common.grammar ("" is none); no help text, so it is not a command-line option
    grammar: str = dataclasses.field(default="")
    presence_penalty: float = setting(0.0, "Subtracted from the logit of every token the answer already holds; "
                                           "in [-2, 2].")
    frequency_penalty: float = setting(0.0, "Subtracted from a token's logit once for each time the answer holds "
                                            "it; in [-2, 2].")
    # token id, in decimal as OpenAI's JSON has it -> a bias in [-100, 100] added to its logit
    logit_bias: dict[str, float] = dataclasses.field(default_factory=dict)
    # report each sampled token's log-probability, and those of the top_logprobs most likely tokens
    logprobs: bool = dataclasses.field(default=False)
    top_logprobs: int = dataclasses.field(default=0)

    def __post_init__(self):
        floats = (self.temperature, self.top_p, self.min_p, self.repetition_penalty, self.presence_penalty,
                  self.frequency_penalty)
        checks = [(all(isinstance(v, (int, float)) and math.isfinite(v) for v in floats),
                   "sampling parameters must be finite numbers"),
                  (self.temperature >= 0, "temperature must be >= 0"),
                  (isinstance(self.top_k, int) and self.top_k >= 0, "top_k must be an integer >= 0"),
                  (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
                  (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
                  (self.repetition_penalty > 0, "repetition_penalty must be > 0"),
                  (abs(self.presence_penalty) <= PENALTY_RANGE, "presence_penalty must be in [-2, 2]"),
                  (abs(self.frequency_penalty) <= PENALTY_RANGE, "frequency_penalty must be in [-2, 2]"),
                  (self.seed is None or isinstance(self.seed, int) and 0 <= self.seed < SEED_MODULUS,
                   "seed must be an integer in [0, 2^63)"),
                  (isinstance(self.grammar, str) and len(self.grammar) <= MAX_GRAMMAR_CHARS,
                   f"grammar must be a string of at most {MAX_GRAMMAR_CHARS} characters"),
                  (isinstance(self.logprobs, bool), "logprobs must be a boolean"),
                  (type(self.top_logprobs) is int and 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS,
                   f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}]"),
                  (self.logprobs or not self.top_logprobs, "top_logprobs needs logprobs")]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))

    def for_choice(self, index: int) -> SamplingParams:
        """The parameters of copy `index` of a request that asks for several (`n`): seed + index
        (wrapping inside int64), the same parameters without a seed."""
        if self.seed is None or index == 0:
            return self
        return dataclasses.replace(self, seed=(self.seed + index) % SEED_MODULUS)


def _logit_bias(bias: object) -> dict[str, float]:
    """logit_bias with its keys as decimal token ids and its values as floats; ints are taken as keys
    too, so that Python callers need not spell ids as strings."""
    if not isinstance(bias, dict):
        raise ValueError("logit_bias must be a map of token ids to biases")
    if len(bias) > MAX_LOGIT_BIAS:
        raise ValueError(f"logit_bias may hold at most {MAX_LOGIT_BIAS} tokens, it holds {len(bias)}")
    out = {}
    for key, value in bias.items():
        digits = isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 19
        if not (type(key) is int or digits) or not 0 <= int(key) < SEED_MODULUS:
            raise ValueError(f"logit_bias: {str(key)[:40]!r} is not a token id")
        if not (type(value) in (int, float) and abs(value) <= BIAS_RANGE):      # NaN and inf fail the bound
            raise ValueError(f"logit_bias[{key}] must be a number in [-100, 100]")
        out[str(int(key))] = float(value)
    return out


class Sampler:
    def __init__(self, params: SamplingParams, prompt_len: int = 0):
        """`prompt_len`: how much of the history that `sample` gets is the prompt; the presence and
        frequency penalties count only the tokens after it."""
        self.params = params
        self.prompt_len = prompt_len
        self.rng = np.random.default_rng(params.seed)
        bias = sorted((int(k), v) for k, v in params.logit_bias.items())
        self._bias_ids = np.array([k for k, _ in bias], dtype=np.int64)
        self._bias = np.array([v for _, v in bias], dtype=np.float64)

    def sample(self, logits: np.ndarray, history: Sequence[int] = (), allowed: np.ndarray | None = None) -> int:
        """`allowed`: (vocab,) bool, the tokens a grammar lets through, or None for all. Those are
        sampled among themselves, which costs less than masking the rest of the vocabulary."""
        if allowed is None:
            return self._sample(np.asarray(logits, dtype=np.float64).copy(), history, None)
        ids = np.flatnonzero(allowed)
        if not ids.size:                     # nothing is allowed: the grammar refuses whatever comes
            return int(np.argmax(logits))
        return int(ids[self._sample(np.asarray(logits, dtype=np.float64)[ids], history, ids)])

    def processed(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """(vocab,) float64: the logits after logit_bias and the penalties, a NaN as -inf, which
        temperature and the filters then shape."""
        out = np.asarray(logits, dtype=np.float64).copy()
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            out[np.isnan(out)] = -np.inf
            self._adjust(out, history, None)
        return out

    def _sample(self, logits: np.ndarray, history: Sequence[int], ids: np.ndarray | None) -> int:
        """`logits`: the row of the tokens `ids` (sorted; None is the whole vocabulary), changed in place."""
        p = self.params
        with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
            logits[np.isnan(logits)] = -np.inf
            self._adjust(logits, history, ids)
            alive = logits > -np.inf
            if p.temperature == 0.0 or not alive.any():
                return int(np.argmax(logits))
            # z: [vocab], <= 0 with the best at exactly 0; the dead are -inf
            z = np.where(alive, np.clip(logits, -LOGIT_LIMIT, LOGIT_LIMIT), -np.inf)
            z = (z - z.max()) / p.temperature
            return self._draw(z)

    def _adjust(self, logits: np.ndarray, history: Sequence[int], ids: np.ndarray | None) -> None:
        """logit_bias, then the repetition penalty, then the presence and frequency penalties."""
        p = self.params
        if self._bias_ids.size:
            at, there = _places(self._bias_ids, ids)
            logits[at[there]] += self._bias[there]
        if p.repetition_penalty != 1.0 and len(history):
            at, there = _places(np.unique(np.asarray(history, dtype=np.int64)), ids)
            vals = logits[at[there]]
            logits[at[there]] = np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if (p.presence_penalty or p.frequency_penalty) and len(history) > self.prompt_len:
            tokens, counts = np.unique(np.asarray(history[self.prompt_len:], dtype=np.int64), return_counts=True)
            at, there = _places(tokens, ids)
            logits[at[there]] -= p.presence_penalty + p.frequency_penalty * counts[there]

    def distribution(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """(vocab,) float64 summing to 1: the distribution that `sample(logits, history)` draws
        from, after logit_bias, the penalties, temperature, top-k, min-p and top-p; where sample
        falls back to the argmax (greedy, or nothing left), all of the mass is on that token.
        Speculative decoding accepts drafts against it (common.speculative)."""
        p = self.params
        z = self.processed(logits, history)
        alive = z > -np.inf
        out = np.zeros(z.size)
        if p.temperature == 0.0 or not alive.any():
            out[int(np.argmax(z))] = 1.0
            return out
        with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
            z = np.where(alive, np.clip(z, -LOGIT_LIMIT, LOGIT_LIMIT), -np.inf)
            z = (z - z.max()) / p.temperature
            probs = self._filtered(z)
        total = probs.sum()
        if not (total > 0 and math.isfinite(total)):
            out[int(np.argmax(z))] = 1.0
            return out
        return probs / total

    def _filtered(self, z: np.ndarray) -> np.ndarray:
        """The unnormalized probabilities of tempered logits `z` (changed in place) after top-k, min-p, top-p."""
        p = self.params
        if p.top_k > 0 and p.top_k < z.size:
            kth = np.partition(z, -p.top_k)[-p.top_k]
            z[z < kth] = -np.inf
        probs = np.exp(z)
        if p.min_p > 0.0:
            probs[probs < p.min_p * probs.max()] = 0.0
        if p.top_p < 1.0:
            probs = top_p_filter(probs, p.top_p)
        return probs

    def _draw(self, z: np.ndarray) -> int:
        probs = self._filtered(z)
        total = probs.sum()
        if not (total > 0 and math.isfinite(total)):
            return int(np.argmax(z))
        return choose(self.rng, probs, total)


def top_p_filter(probs: np.ndarray, top_p: float) -> np.ndarray:
    """`probs` with all but the smallest set of most likely tokens whose mass reaches top_p zeroed,
    the set a stable sort of the whole row picks. Only a candidate set is sorted: every token at
    least as likely as the m-th, ties included, so that its sorted order is the whole row's prefix;
    m grows until the candidates' mass reaches top_p; once m passes the vocabulary, the whole row is sorted."""
    total = probs.sum()
    m = TOP_P_CANDIDATES
    while m < probs.size:
        kth = np.partition(probs, probs.size - m)[probs.size - m]
        cand = np.flatnonzero(probs >= kth) if kth > 0 else np.flatnonzero(probs > 0)
        order = cand[np.argsort(-probs[cand], kind="stable")]
        cum = np.cumsum(probs[order]) / total
        if cum.size and cum[-1] >= top_p:
            return _keep(probs, order[:np.searchsorted(cum, top_p) + 1])
        if kth == 0:                         # every token that has mass is in, and short of top_p by rounding
            return probs
        m *= 8
    order = np.argsort(-probs, kind="stable")
    cum = np.cumsum(probs[order]) / total
    return _keep(probs, order[:np.searchsorted(cum, top_p) + 1])


def _keep(probs: np.ndarray, keep: np.ndarray) -> np.ndarray:
    out = np.zeros_like(probs)
    out[keep] = probs[keep]
    return out


def choose(rng: np.random.Generator, probs: np.ndarray, total: float) -> int:
    """rng.choice(probs.size, p=probs / total): the same token from the same stream. When few
    tokens have mass, the cumulative sum is taken over those alone, as adding a zero changes no sum."""
    sparse = np.count_nonzero(probs) * 4 < probs.size
    ids = np.flatnonzero(probs) if sparse else None
    cdf = np.cumsum((probs[ids] if sparse else probs) / total)
    cdf /= cdf[-1]
    at = int(np.searchsorted(cdf, rng.random(), side="right"))
    return int(ids[at]) if sparse else at


def _places(tokens: np.ndarray, ids: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Where sorted, distinct `tokens` are in a row of the tokens `ids` (sorted; None is the whole
    vocabulary), and which of them are there."""
    if ids is None:
        return tokens, np.ones(tokens.size, dtype=bool)
    at = np.minimum(np.searchsorted(ids, tokens), ids.size - 1)
    return at, ids[at] == tokens
