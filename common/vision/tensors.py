"""An mmproj GGUF file: its VisionConfig and its tensors by role, checked against the specification.

Roles (numpy shapes; H the tower's width, F its FFN, M = merge^2 H, D the text hidden):
- globals: patch0, patch1 (H, 3, P, P): the Conv3D's temporal halves; patch_b (H,); pos (side^2, H);
  post_ln_w, post_ln_b (H,): the merger's LayerNorm; mm0_w (M, M), mm0_b (M,); mm2_w (D, M), mm2_b (D,)
- per block: ln1_w, ln1_b, ln2_w, ln2_b (H,); qkv_w (3H, H), qkv_b (3H,); out_w (H, H), out_b (H,);
  up_w (F, H), up_b (F,); down_w (H, F), down_b (H,)
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable

from common.model.config import ModelConfigError
from common.model.gguf_file import GGUFModel, Tensor
from common.model.layers import MAX_LISTED, Bound, _same_shape

from .config import VisionConfig

Shape = Callable[[VisionConfig], tuple[int, ...]]


def _h(c: VisionConfig) -> tuple[int, ...]:
    return (c.hidden_size,)


def _merged(c: VisionConfig) -> int:
    return c.merge_size ** 2 * c.hidden_size


def _patch(c: VisionConfig) -> tuple[int, ...]:
    return (c.hidden_size, 3, c.patch_size, c.patch_size)


GLOBALS: tuple[tuple[str, str, Shape], ...] = (
    ("patch0", "v.patch_embd.weight", _patch),
    ("patch1", "v.patch_embd.weight.1", _patch),
    ("patch_b", "v.patch_embd.bias", _h),
    ("pos", "v.position_embd.weight", lambda c: (c.n_positions, c.hidden_size)),
    ("post_ln_w", "v.post_ln.weight", _h),
    ("post_ln_b", "v.post_ln.bias", _h),
    ("mm0_w", "mm.0.weight", lambda c: (_merged(c), _merged(c))),
    ("mm0_b", "mm.0.bias", lambda c: (_merged(c),)),
    ("mm2_w", "mm.2.weight", lambda c: (c.projection_dim, _merged(c))),
    ("mm2_b", "mm.2.bias", lambda c: (c.projection_dim,)),
)

BLOCK: tuple[tuple[str, str, Shape], ...] = (
    ("ln1_w", "ln1.weight", _h),
    ("ln1_b", "ln1.bias", _h),
    ("qkv_w", "attn_qkv.weight", lambda c: (3 * c.hidden_size, c.hidden_size)),
    ("qkv_b", "attn_qkv.bias", lambda c: (3 * c.hidden_size,)),
    ("out_w", "attn_out.weight", lambda c: (c.hidden_size, c.hidden_size)),
    ("out_b", "attn_out.bias", _h),
    ("ln2_w", "ln2.weight", _h),
    ("ln2_b", "ln2.bias", _h),
    ("up_w", "ffn_up.weight", lambda c: (c.ffn_size, c.hidden_size)),
    ("up_b", "ffn_up.bias", lambda c: (c.ffn_size,)),
    ("down_w", "ffn_down.weight", lambda c: (c.hidden_size, c.ffn_size)),
    ("down_b", "ffn_down.bias", _h),
)


@dataclass(frozen=True)
class BoundVision:
    globals: Bound
    blocks: list[Bound]


class MmprojFile:
    """One mmproj file, memory-mapped: `config` from its metadata, `bound` its tensors by role."""

    def __init__(self, path: str | Path):
        self.model = GGUFModel(path)
        self.path = self.model.path

    @cached_property
    def config(self) -> VisionConfig:
        pos = self.model.tensors.get("v.position_embd.weight")
        if pos is None:
            raise ModelConfigError(f"{self.path}: missing tensor 'v.position_embd.weight'")
        n_positions = pos.shape[0]
        if round(n_positions ** 0.5) ** 2 != n_positions:
            raise ModelConfigError(f"{self.path}: v.position_embd.weight has {n_positions} rows, not a square grid")
        return VisionConfig.from_gguf_fields(self.model.get, self.model.has, self.path, n_positions)

    @cached_property
    def bound(self) -> BoundVision:
        return bind_vision(self.config, self.model.tensors, self.path)


def bind_vision(cfg: VisionConfig, tensors: dict[str, Tensor], path: Path) -> BoundVision:
    """Every tensor checked against the specification; one ModelConfigError names every problem."""
    problems: list[str] = []
    seen: set[str] = set()

    def take(name: str, role: str, shape: Shape, where: str) -> Tensor | None:
        t = tensors.get(name)
        if t is None:
            problems.append(f"missing tensor {name} ({where}, role {role}, expected shape {shape(cfg)})")
            return None
        seen.add(name)
        if not _same_shape(t.shape, shape(cfg)):
            problems.append(f"tensor {name} ({where}, role {role}) has shape {tuple(t.shape)}, "
                            f"expected {shape(cfg)}")
        return t

    glob = {role: take(name, role, shape, "global") for role, name, shape in GLOBALS}
    blocks = [{role: take(f"v.blk.{i}.{suffix}", role, shape, f"block {i}") for role, suffix, shape in BLOCK}
              for i in range(cfg.n_blocks)]
    unknown = [n for n in tensors if n not in seen]
    if unknown:
        names = ", ".join(unknown[:MAX_LISTED]) + (f" and {len(unknown) - MAX_LISTED} more"
                                                   if len(unknown) > MAX_LISTED else "")
        problems.append(f"unknown tensors {names}")
    if problems:
        raise ModelConfigError(f"{path}: the tensors do not match the {cfg.projector_type} mmproj "
                               "specification (common/vision/tensors.py):\n  " + "\n  ".join(problems[:MAX_LISTED]))
    return BoundVision(glob, blocks)
