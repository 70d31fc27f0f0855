"""`convert(src, out, type)`: an HF checkpoint directory to one GGUF file.

The file is laid out first (metadata and every tensor's name, shape and type), then each
tensor is loaded, transformed, quantized and written in turn, so memory holds one tensor
(one expert stack) at a time. Output goes to a temporary file beside `out`, renamed into
place only when complete; on any failure it is removed.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from tqdm import tqdm

from .arch import arch_for, metadata
from .errors import ConvertError
from .hf_reader import Checkpoint
from .mtp_check import check_mtp_block
from .quantize import TensorSlot, choose_type, file_type, quantize, stored_nbytes
from .tensor_map import mtp_blocks, plan
from .tokenizer_meta import add_tokenizer


@dataclass(frozen=True)
class ConvertResult:
    path: Path
    arch: str
    n_tensors: int
    nbytes: int
    types: dict[str, int]        # GGML type name -> tensor count
    has_tokenizer: bool


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _add_kv(writer: GGUFWriter, key: str, value, vtype, sub_type) -> None:
    writer.add_key_value(key, value, vtype, sub_type=sub_type)


def convert(src: str | Path, out: str | Path, out_type: str = "f16", *,
            progress: bool = True, name: str | None = None, mtp: bool = True) -> ConvertResult:
    """`mtp`: keep the checkpoint's MTP block (`mtp.*`) as llama.cpp does; False drops it, as
    llama.cpp's --no-mtp."""
    src, out = Path(src), Path(out)
    ft = file_type(out_type)
    ckpt = Checkpoint(src)
    arch = arch_for(ckpt.config, src)
    hp = ckpt.text_config
    n_mtp = mtp_blocks(ckpt) if mtp else 0
    meta = metadata(arch, hp, src, ft.ftype, n_mtp)   # first: names any missing config key
    tensors = plan(ckpt, arch, hp, mtp=n_mtp > 0)
    check_mtp_block(tensors, meta, arch.gguf_arch, int(hp["vocab_size"]), src)
    n_layers = int(hp["num_hidden_layers"])
    qtypes = [choose_type(TensorSlot(t.name, t.shape, n_layers), ft) for t in tensors]

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=out.name + ".tmp-", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = GGUFWriter(tmp, arch.gguf_arch)
        writer.add_type("model")
        writer.add_name(name or src.resolve().name)
        for key, value, vtype, sub in meta:
            _add_kv(writer, key, value, vtype, sub)
        has_tok = add_tokenizer(writer, src, int(hp["vocab_size"]), arch.tokenizer_pre)
        for t, q in zip(tensors, qtypes):
            writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32),
                                   stored_nbytes(t.shape, q), raw_dtype=q)
        writer.write_header_to_file(tmp)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t, q in tqdm(list(zip(tensors, qtypes)), desc=f"convert {out.name}", unit="tensor",
                         disable=not progress):
            data = t.load()
            if data.shape != t.shape:
                raise ConvertError(src, f"{t.name}: expected shape {t.shape}, got {data.shape}")
            writer.write_tensor_data(np.ascontiguousarray(quantize(data, q)))
        writer.close()
        os.chmod(tmp, 0o666 & ~_umask())         # mkstemp makes it private; a model is not
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    counts: dict[str, int] = {}
    for q in qtypes:
        counts[GGMLQuantizationType(q).name] = counts.get(GGMLQuantizationType(q).name, 0) + 1
    return ConvertResult(out, arch.gguf_arch, len(tensors), out.stat().st_size, counts, has_tok)
