"""Before anything is written: a checkpoint's MTP block must be whole, as common/model/layers.py
specifies it, or the file would not load; the error names the tensors it lacks."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import ModelConfig
from ..layers import layer_specs
from .errors import ConvertError
from .tensor_map import LAYER_RULES, NEXTN_RULES, OutTensor

# GGUF suffix -> the checkpoint's name for it, for the message
_HF_NAMES = ({g: hf for hf, (g, _) in NEXTN_RULES.items()}
             | {g: f"mtp.layers.K.{hf}" for hf, (g, _) in LAYER_RULES.items()})


def check_mtp_block(tensors: list[OutTensor], meta: list[tuple[str, Any, Any, Any]], gguf_arch: str,
                    vocab: int, src: Path) -> None:
    fields = {key: value for key, value, *_ in meta} | {"general.architecture": gguf_arch}
    cfg = ModelConfig.from_gguf_fields(fields.__getitem__, fields.__contains__, src, vocab)
    names = {t.name for t in tensors}
    for i in range(cfg.n_layers, cfg.n_layers + cfg.n_nextn_layers):
        missing = [s.suffix for s in layer_specs(cfg, i) if not s.optional and f"blk.{i}.{s.suffix}" not in names]
        if missing:
            listed = ", ".join(f"blk.{i}.{m}" + (f" ({_HF_NAMES[m]})" if m in _HF_NAMES else "") for m in missing)
            raise ConvertError(src, f"the MTP block (mtp.*) is incomplete, it lacks {listed}; "
                                    f"convert with --no-mtp to leave it out")
