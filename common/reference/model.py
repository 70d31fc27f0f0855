"""The numpy float32 reference model: the yardstick every fast path is held against.

Its KV cache is in `kv_type` (common.kv_cache), converted by the numpy reference conversions,
so that it defines what a native engine with that cache computes.

It is plain on purpose: one layer object per block, the chunked Gated DeltaNet for prefill and
the recurrent form for decode, weights dequantized from the GGUF blocks as they are needed.
Speculative decoding's verify runs the rows one at a time in the recurrent form, saving the
recurrent state after each (common/reference/rollback.py); the draft step is the MTP block
(common/reference/mtp.py). A prompt with images takes the vision encoder's rows in place of its
image tokens' embeddings and mRoPE positions (common/reference/multimodal.py); text alone keeps
the 1-D RoPE.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..kv_cache import check_kv_type, check_same_kv_type
from ..model.gguf_file import GGUFModel
from ..model.layers import bind
from ..state import Checkpoint, DraftState, RollbackSlots, SequenceState, checkpoint_marks
from . import rollback as rb
from .attention import GatedAttention
from .deltanet import PREFILL_CHUNK, GatedDeltaNet
from .ffn import make_ffn
from .mtp import MtpBlock
from .multimodal import MropeInput, text_input
from .ops import rms_norm
from .weights import LayerWeights, Weights


class ReferenceModel:
    def __init__(self, model: GGUFModel, kv_type: str = "f32"):
        self.model = model
        self.cfg = cfg = model.config
        self.kv_type = check_kv_type(kv_type, cfg.head_dim)
        self.w = Weights(model)
        bound = bind(model)
        self.globals = bound.globals
        self.layers = [LayerWeights(self.w, tensors) for tensors in bound.layers]
        self.mixers = [GatedAttention(cfg, w, kv_type) if cfg.is_full_attention(i) else GatedDeltaNet(cfg, w)
                       for i, w in enumerate(self.layers)]
        self.ffns = [make_ffn(cfg, w) for w in self.layers]
        # layer -> its index among the linear or the full-attention layers (the state's order)
        self.slot = {i: n for n, i in enumerate(cfg.linear_layers)} | {i: n for n, i in enumerate(cfg.full_layers)}
        self.mtp = MtpBlock(cfg, self.w, bound.mtp, self.globals, kv_type) if bound.mtp is not None else None

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        return True, "numpy"

    def new_state(self) -> SequenceState:
        return SequenceState.empty(self.cfg, self.kv_type)

    def prefill(self, tokens: Sequence[int], state: SequenceState, *, chunk: int = PREFILL_CHUNK,
                all_logits: bool = False, mm: MropeInput | None = None) -> np.ndarray:
        """Chunked form over the prompt. Returns logits [vocab] of the last token, or [T, vocab].
        `mm`: the image embeddings and mRoPE positions of a prompt with images (multimodal.py)."""
        logits = self.forward(tokens, state, recurrent=False, chunk=chunk, all_logits=all_logits, mm=mm)
        return logits if all_logits else logits[-1]

    def prefill_with_checkpoints(self, tokens: Sequence[int], state: SequenceState, checkpoints: Sequence[int], *,
                                 chunk: int = PREFILL_CHUNK, mm: MropeInput | None = None,
                                 progress=None) -> tuple[np.ndarray, list[Checkpoint]]:
        """prefill's last logits, and the Checkpoint at each of `checkpoints` (positions strictly
        inside the call, increasing), taken in the same pass: the DeltaNet chunks restart at each,
        so each equals a prefill that stopped there. `progress()` is called after each layer."""
        start = state.pos
        marks = checkpoint_marks(checkpoints, start, len(tokens))
        caught: list[list] = []
        x = self.hidden(tokens, state, recurrent=False, chunk=chunk, mm=mm, marks=marks, caught=caught,
                        progress=progress)
        logits = self.w.matmul_rows_blocked(self.globals["head"], x[[m - 1 for m in marks] + [-1]])
        n_lin = len(self.cfg.linear_layers)
        out = [Checkpoint(start + m, [caught[n][j][0] for n in range(n_lin)], [caught[n][j][1] for n in range(n_lin)],
                          logits[j]) for j, m in enumerate(marks)]
        return logits[-1], out

    def decode(self, tokens: Sequence[int], states: list[SequenceState]) -> np.ndarray:
        """One token per sequence, recurrent form. Returns logits [B, vocab]."""
        return np.stack([self.forward([t], s, recurrent=True)[-1] for t, s in zip(tokens, states)])

    def forward(self, tokens: Sequence[int], state: SequenceState, *, recurrent: bool,
                chunk: int = PREFILL_CHUNK, all_logits: bool = True, mm: MropeInput | None = None) -> np.ndarray:
        x = self.hidden(tokens, state, recurrent=recurrent, chunk=chunk, last_only=not all_logits, mm=mm)
        return self.w.matmul_rows_blocked(self.globals["head"], x)

    def hidden(self, tokens: Sequence[int], state: SequenceState, *, recurrent: bool,
               chunk: int = PREFILL_CHUNK, last_only: bool = False, mm: MropeInput | None = None,
               marks: Sequence[int] = (), caught: list | None = None, progress=None) -> np.ndarray:
        """The trunk over `tokens` from state.pos: the hidden after output_norm, [T or 1, hidden].
        With `marks` (row offsets), each linear layer appends to `caught` its [(conv, ssm)] there."""
        cfg = self.cfg
        ids = self._ids(tokens)
        check_same_kv_type(state.kv_type, self.kv_type, "the state", "this runner")
        x = self.w.rows(self.globals["embd"], ids)                            # [T, hidden]
        if mm is None and state.rope_delta:                                   # text after an image
            mm = text_input(state.pos + state.rope_delta, len(ids))
        rope_pos = self._check_mm(mm, len(ids))
        if mm is not None and len(mm.rows):
            x[mm.rows] = mm.embeds                                            # image tokens: the encoder's rows
        for i in range(cfg.n_layers):
            w, n = self.layers[i], self.slot[i]
            h = rms_norm(x, w["attn_norm"], cfg.rms_eps)
            if cfg.is_full_attention(i):
                h, state.k[n], state.v[n] = self.mixers[i].forward(h, state.k[n], state.v[n], state.pos, rope_pos)
            else:
                h, state.conv[n], state.ssm[n], at_marks = self.mixers[i].forward(
                    h, state.conv[n], state.ssm[n], recurrent, chunk, tuple(marks))
                if caught is not None:
                    caught.append(at_marks)
            x = x + h
            h = rms_norm(x, w["post_norm"], cfg.rms_eps)
            x = x + self.ffns[i].forward(h)
            if progress is not None:
                progress()
        state.pos += len(ids)
        if last_only:
            x = x[-1:]
        return rms_norm(x, self.w.get(self.globals["out_norm"]), cfg.rms_eps)

    def _check_mm(self, mm: MropeInput | None, n: int) -> np.ndarray | None:
        if mm is None:
            return None
        if mm.n_rows != n:
            raise ValueError(f"mRoPE positions for {mm.n_rows} rows, the call has {n}")
        sections = self.cfg.rope_sections
        if len(sections) < 3 or sum(sections) != self.cfg.rope_dim // 2:
            raise ValueError(f"{self.model.path}: {self.cfg.arch}.rope.dimension_sections is {list(sections)}; "
                             f"mRoPE for images needs sections that sum to {self.cfg.rope_dim // 2}")
        if len(mm.rows) and mm.embeds.shape != (len(mm.rows), self.cfg.hidden_size):
            raise ValueError(f"image embeddings of shape {list(mm.embeds.shape)}; the model takes "
                             f"[{len(mm.rows)}, {self.cfg.hidden_size}]")
        return mm.rope_pos

    def _ids(self, tokens: Sequence[int]) -> np.ndarray:
        ids = np.asarray(tokens, dtype=np.int64)
        if ids.ndim != 1 or len(ids) == 0:
            raise ValueError("forward needs a non-empty 1-D token sequence")
        if ids.min() < 0 or ids.max() >= self.cfg.vocab_size:
            raise ValueError(f"token id out of range [0, {self.cfg.vocab_size})")
        return ids

    # ---- speculative decoding (the runner methods of issue #31)

    @property
    def has_mtp(self) -> bool:
        return self.mtp is not None

    def new_draft_state(self) -> DraftState:
        return self._mtp().new_state()

    def draft_state_bytes(self, positions: int) -> int:
        return self._mtp().state_bytes(positions)

    def new_rollback(self, slots: int) -> RollbackSlots:
        return rb.new_rollback(self.cfg, slots)

    def rollback_bytes(self, slots: int) -> int:
        return rb.rollback_bytes(self.cfg, slots)

    def verify(self, tokens: list[list[int]], states: list[SequenceState],
               rollbacks: list[RollbackSlots | None]) -> tuple[np.ndarray, np.ndarray]:
        """Each sequence's tokens in order from its pos, row by row in the recurrent form, so that
        row j's logits are decode()'s; rollbacks[b] slot j gets the recurrent state after row j
        (j < len - 1). Returns (logits [R, vocab], hidden after output_norm [R, hidden])."""
        if not len(tokens) == len(states) == len(rollbacks):
            raise ValueError("verify: tokens, states and rollbacks differ in length")
        for b, (seq, slots) in enumerate(zip(tokens, rollbacks)):
            rb.check_rollback(slots, len(seq), b)
        logits, hidden = [], []
        for seq, state, slots in zip(tokens, states, rollbacks):
            for j, token in enumerate(seq):
                h = self.hidden([token], state, recurrent=True)                  # [1, hidden]
                logits.append(self.w.matmul_rows_blocked(self.globals["head"], h)[0])
                hidden.append(h[0])
                if j < len(seq) - 1:
                    rb.save_slot(state, slots, j)
        return np.stack(logits).astype(np.float32), np.stack(hidden).astype(np.float32)

    def keep(self, state: SequenceState, rollback: RollbackSlots | None, rows: int, ran: int) -> None:
        rb.keep(state, rollback, rows, ran)

    def set_draft_vocab(self, ids: np.ndarray | None) -> None:
        if ids is None and self.mtp is None:
            return                        # the default, on a model that cannot draft at all
        self._mtp().set_vocab(ids)

    def draft(self, tokens: list[list[int]], hidden: np.ndarray, dstates: list[DraftState],
              last_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The MTP block over each sequence's rows: row r is (tokens[b][j], hidden[r]), in order.
        Returns (logits [R, V'], h_out [R, hidden]), h_out the next chained draft's hidden; with
        `last_only`, those of each sequence's last row alone."""
        mtp = self._mtp()
        if len(tokens) != len(dstates):
            raise ValueError("draft: tokens and draft states differ in length")
        rows = sum(len(t) for t in tokens)
        hidden = np.asarray(hidden, np.float32)
        if hidden.shape != (rows, self.cfg.hidden_size):
            raise ValueError(f"draft: hidden is {list(hidden.shape)}, the rows need [{rows}, {self.cfg.hidden_size}]")
        out, r = [], 0
        for seq, dstate in zip(tokens, dstates):
            if len(seq):
                h = mtp.forward(self._ids(seq), hidden[r:r + len(seq)], dstate)
                out.append(h[-1:] if last_only else h)
                r += len(seq)
        h_out = np.concatenate(out).astype(np.float32) if out else np.zeros((0, self.cfg.hidden_size), np.float32)
        return mtp.logits(h_out), h_out

    def _mtp(self) -> MtpBlock:
        if self.mtp is None:
            raise ValueError(f"{self.model.path}: the model file has no MTP block (nextn), so it cannot draft")
        return self.mtp
