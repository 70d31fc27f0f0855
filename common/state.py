"""The state of one sequence: what prefill hands to decode, and what a snapshot stores.

Per linear-attention layer: the conv tail and the Gated DeltaNet matrix.
Per full-attention layer: the K and V caches up to `pos`, in the cache's type (common.kv_cache).
After an image, the rotary position of a text row is its sequence position plus `rope_delta`
(an image of h x w tokens advances the mRoPE position by max(h, w), not by h * w:
common/reference/multimodal.py), so decode carries on at `pos + rope_delta`.
`check_state` holds arrays from the wire to the model's shapes before any native code reads
them; `wire_limits` is the largest message that can legitimately carry a state.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .kv_cache import check_kv_type, kv_dtype, kv_shape
from .model.config import ModelConfig
from .protocol.codec import WireLimits

STATE_DTYPE = np.float32           # the recurrent state and the logits; KV is in the cache's type
HEADER_SLACK = 1 << 20             # bytes of a header beyond its token lists: ids, sampling, addresses
MSGPACK_INT = 9                    # the most bytes msgpack spends on one int


@dataclass
class SequenceState:
    pos: int                                  # tokens consumed so far
    conv: list[np.ndarray]                    # per linear layer: (conv_channels, conv_kernel - 1) f32
    ssm: list[np.ndarray]                     # per linear layer: (n_v_heads, head_k_dim, head_v_dim) f32
    k: list[np.ndarray] = field(default_factory=list)   # per full layer: kv_shape(pos, ...) in kv_type
    v: list[np.ndarray] = field(default_factory=list)   # per full layer: kv_shape(pos, ...) in kv_type
    kv_type: str = "f32"                      # common.kv_cache.KV_TYPES
    rope_delta: int = 0                       # the next row's rotary position minus pos (images before it)

    @property
    def rope_pos(self) -> int:
        """The rotary position of the next text row."""
        return self.pos + self.rope_delta

    @classmethod
    def empty(cls, cfg: ModelConfig, kv_type: str = "f32") -> "SequenceState":
        n_lin, n_full = len(cfg.linear_layers), len(cfg.full_layers)
        kv = kv_shape(0, cfg.n_kv_heads, cfg.head_dim, check_kv_type(kv_type, cfg.head_dim))
        return cls(
            pos=0,
            conv=[np.zeros((cfg.conv_channels, cfg.conv_kernel - 1), np.float32) for _ in range(n_lin)],
            ssm=[np.zeros((cfg.n_v_heads, cfg.head_k_dim, cfg.head_v_dim), np.float32) for _ in range(n_lin)],
            k=[np.zeros(kv, kv_dtype(kv_type)) for _ in range(n_full)],
            v=[np.zeros(kv, kv_dtype(kv_type)) for _ in range(n_full)],
            kv_type=kv_type,
        )

    def copy(self) -> "SequenceState":
        return SequenceState(self.pos, [a.copy() for a in self.conv], [a.copy() for a in self.ssm],
                             [a.copy() for a in self.k], [a.copy() for a in self.v], self.kv_type, self.rope_delta)

    def arrays(self) -> list[np.ndarray]:
        """All arrays in a fixed order: conv..., ssm..., k..., v... (the wire and disk order)."""
        return [*self.conv, *self.ssm, *self.k, *self.v]

    @classmethod
    def from_arrays(cls, pos: int, arrays: list[np.ndarray], cfg: ModelConfig,
                    kv_type: str = "f32", rope_delta: int = 0) -> "SequenceState":
        """Arrays in arrays() order at position `pos`, checked by check_state and check_rope_delta
        (ValueError)."""
        check_state(pos, arrays, cfg, kv_type)
        check_rope_delta(pos, rope_delta)
        n_lin, n_full = len(cfg.linear_layers), len(cfg.full_layers)
        a = list(arrays)
        return cls(pos, a[:n_lin], a[n_lin:2 * n_lin], a[2 * n_lin:2 * n_lin + n_full],
                   a[2 * n_lin + n_full:], kv_type, int(rope_delta))

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays())


@dataclass
class Checkpoint:
    """What one prefill captured at position `pos` on its way: per linear layer the conv tail and
    the recurrent state there, and the logits of the token before it (a Snapshot's row). Its KV
    is the first `pos` rows of the prefill's final KV, so it keeps none."""
    pos: int
    conv: list[np.ndarray]                    # per linear layer: (conv_channels, conv_kernel - 1) f32
    ssm: list[np.ndarray]                     # per linear layer: (n_v_heads, head_k_dim, head_v_dim) f32
    logits: np.ndarray                        # (vocab,) f32

    def state(self, final: SequenceState, rope_delta: int = 0) -> SequenceState:
        """The state at `pos`, its KV views of `final`'s (the same prefill's end state)."""
        if not self.pos <= final.pos:
            raise ValueError(f"a checkpoint at {self.pos} is past the final state's position {final.pos}")
        return SequenceState(self.pos, self.conv, self.ssm, [k[:self.pos] for k in final.k],
                             [v[:self.pos] for v in final.v], final.kv_type, rope_delta)


def checkpoint_marks(checkpoints, start: int, n: int) -> list[int]:
    """Checkpoint positions as offsets into a call of n tokens from `start`: each strictly inside
    it (0 < offset < n; the end is the call's own result), in increasing order (ValueError)."""
    marks = [int(p) - start for p in checkpoints]
    if any(not 0 < m < n for m in marks) or any(a >= b for a, b in zip(marks, marks[1:])):
        raise ValueError(f"checkpoints {list(checkpoints)} must increase strictly inside ({start}, {start + n})")
    return marks


@dataclass
class DraftState:
    """The MTP block's KV cache of one sequence, kept by decode alone: row 0 is the first position that
    decode ran (RoPE is relative, so local positions score as absolute ones would). The runner reads
    rows below `pos` and writes from `pos`; lowering `pos` drops the rows above it."""
    pos: int
    k: np.ndarray                             # kv_shape(>= pos, ...) in the runner's kv_type
    v: np.ndarray


@dataclass
class RollbackSlots:
    """Copies of one sequence's recurrent state for a speculative verify: slot j holds the state
    after verified row j, so that a rejected draft rolls back without recomputing."""
    conv: list[list[np.ndarray]]              # [slot][linear layer]: (conv_channels, conv_kernel - 1) f32
    ssm: list[list[np.ndarray]]               # [slot][linear layer]: (n_v_heads, head_k_dim, head_v_dim) f32

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for slot in self.conv + self.ssm for a in slot)


def state_bytes(arrays: list | None) -> int:
    """The bytes of a state's arrays (arrays() order, or any part of them); 0 for None."""
    return sum(a.nbytes for a in arrays) if arrays else 0


def state_specs(pos: int, cfg: ModelConfig, kv_type: str = "f32") -> list[tuple[str, np.dtype, tuple[int, ...]]]:
    """(name, dtype, shape) of every array of a state at `pos` with KV in `kv_type`, in arrays() order."""
    n_lin, n_full = len(cfg.linear_layers), len(cfg.full_layers)
    f4, kt = np.dtype(STATE_DTYPE), kv_dtype(kv_type)
    kv = kv_shape(pos, cfg.n_kv_heads, cfg.head_dim, kv_type)
    return ([(f"conv[{i}]", f4, (cfg.conv_channels, cfg.conv_kernel - 1)) for i in range(n_lin)]
            + [(f"ssm[{i}]", f4, (cfg.n_v_heads, cfg.head_k_dim, cfg.head_v_dim)) for i in range(n_lin)]
            + [(f"k[{i}]", kt, kv) for i in range(n_full)] + [(f"v[{i}]", kt, kv) for i in range(n_full)])


def check_state(pos: int, arrays, cfg: ModelConfig, kv_type: str = "f32", since: int = 0) -> None:
    """Raise ValueError, naming the array, unless `arrays` is a state of this model at `pos` with
    KV in `kv_type`; with `since`, one whose K and V hold only the rows of positions [since, pos)."""
    if isinstance(pos, bool) or not isinstance(pos, (int, np.integer)) or not 0 <= pos <= cfg.context_length:
        raise ValueError(f"state position {pos!r} is outside [0, {cfg.context_length}]")
    if isinstance(since, bool) or not isinstance(since, (int, np.integer)) or not 0 <= since <= pos:
        raise ValueError(f"KV rows from position {since!r} do not end at {pos}")
    if not isinstance(arrays, (list, tuple)):
        raise ValueError(f"state must be a list of arrays, got {type(arrays).__name__}")
    want = state_specs(pos - since, cfg, check_kv_type(kv_type, cfg.head_dim))
    if len(arrays) != len(want):
        raise ValueError(f"state needs {len(want)} arrays, got {len(arrays)}")
    for (name, dtype, shape), a in zip(want, arrays):
        if not isinstance(a, np.ndarray):
            raise ValueError(f"state {name} is a {type(a).__name__}, not an array")
        if a.dtype != dtype or a.shape != shape:
            raise ValueError(f"state {name} is {a.dtype}{list(a.shape)}, the model needs "
                             f"{dtype}{list(shape)}" + (f" (KV cache type {kv_type})" if name[0] in "kv" else ""))


def check_rope_delta(pos: int, rope_delta) -> None:
    """Raise ValueError unless `rope_delta` is an int with pos + rope_delta in [0, pos]: images only
    hold the rotary position back (an image of h x w tokens advances it by max(h, w) <= h * w)."""
    if isinstance(rope_delta, bool) or not isinstance(rope_delta, (int, np.integer)):
        raise ValueError(f"rope_delta must be an integer, got {type(rope_delta).__name__}")
    if not 0 <= pos + rope_delta <= pos:
        raise ValueError(f"rope_delta {rope_delta} at position {pos} puts the rotary position outside "
                         f"[0, {pos}]")


def check_logits(logits, cfg: ModelConfig) -> None:
    """Raise ValueError unless `logits` is (vocab,) float32. Non-finite values pass: the sampler
    meets them like the runner's own, and fails only that sequence."""
    if not isinstance(logits, np.ndarray) or logits.dtype != STATE_DTYPE or logits.shape != (cfg.vocab_size,):
        got = f"{logits.dtype}{list(logits.shape)}" if isinstance(logits, np.ndarray) else type(logits).__name__
        raise ValueError(f"logits are {got}, the model needs float32[{cfg.vocab_size}]")


def wire_limits(cfg: ModelConfig, vision=None) -> WireLimits:
    """The largest message a service of this model can legitimately receive: a whole state at the
    context length plus logits (a Snapshot, Finished or DecodeRequest), and a header holding two
    token lists of that length (a PrefillRequest's tokens and history). f32, the widest KV type,
    bounds every type. With `vision` (a VisionConfig: a prefill worker's --mmproj), a PrefillRequest
    may also hold a context of images: RGB pixels, factor^2 of them per image token, and as many
    images as the smallest image fits in the context."""
    specs = [(d, s) for _, d, s in state_specs(cfg.context_length, cfg)] + [(np.dtype(STATE_DTYPE), (cfg.vocab_size,))]
    shapes = [s for _, s in specs]
    sizes = [int(np.prod(s)) * d.itemsize for d, s in specs]
    header = 2 * cfg.context_length * MSGPACK_INT + HEADER_SLACK
    limits = WireLimits(frame_bytes=max(*sizes, header), message_bytes=sum(sizes) + header, frames=1 + len(shapes))
    if vision is None:
        return limits
    token_pixels = vision.factor ** 2
    images = cfg.context_length // max(1, vision.min_pixels // token_pixels)
    return WireLimits(frame_bytes=max(limits.frame_bytes, 3 * vision.max_pixels),
                      message_bytes=limits.message_bytes + 3 * token_pixels * cfg.context_length,
                      frames=limits.frames + images)
