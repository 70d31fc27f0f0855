"""cffi build of native/cpu: `ffibuilder` for setup.py's cffi_modules.

Files named *_ssse3.c, *_avx2.c, *_avx512.c and *_avx512vbmi.c are compiled here with exactly their ISA's
flags (the SSSE3 ones with -mssse3 and nothing wider) and linked in as objects; every other C
file is compiled by setuptools for the baseline x86-64 target.

The dot kernels are named <weights>_<shape>_<isa>.c, the generic sibling as *_generic.c:
  weights  qx_0: Q4_0, Q8_0 (blocks of 32; SSSE3 also Q4_0p), qx_K: Q4_K, Q5_K, Q6_K (SSSE3
           also Q4_Kp), qx: the quantized types that have batched kernels (Q4_0, Q4_K, Q6_K),
           q32: the other blocks of 32 (Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4),
           q4x8: Q4_0x8 and Q4_Kx8, q6_Kp, float: F32, F16, BF16, iq2: IQ2_XXS, IQ2_XS, IQ2_S
           (iq2_prep.h: their per-block unpacking, shared by the SIMD siblings), lowbit: Q2_K,
           Q3_K, IQ4_XS, TQ2_0, TQ1_0 (the AVX2 and AVX-512 files instances of lowbit_body256.h),
           iq_lowbit: IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (their generic siblings iq3_row_generic.c and
           iq1_row_generic.c)
  shape    row: one weight row . one activation row; batch: one row . up to FM_DOTN_MAX
           activation rows; rows: up to FM_DOTR_MAX rows . up to FM_DOTN_MAX; group: FM_GROUP
           interleaved rows . up to FM_DOTN_MAX (quants.h). A file holds its weights' narrower
           kernels for its ISA too (q6_Kp_batch_avx2.c has the row kernel).
The references of the repacked layouts are in repack.c, and the other per-ISA files hold an op
family (gdn_*.c: the DeltaNet head and conv updates, whose generic sibling is in ops.c;
attn_tiled_*.c: the causal attention of prefill chunks and decode steps over a KV cache in f32,
f16 or q8_0, beside attn_tiled_generic.c; attn_decode.c splits a decode step's keys across the
pool, and kv_cache_generic.c converts the cache types in plain C; vision_gemm_*.c: the vision
tower's GEMM microkernel and row ops, beside vision_gemm.c, whose header vision.h cffi reads too).
"""
from __future__ import annotations

import os
import re
import subprocess
import sysconfig
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
MODULE = "native._fermium_cpu"
HEADERS = ["fermium_cpu.h", "engine_types.h", "engine.h", "vision.h"]
COMMON_FLAGS = ["-O2", "-fPIC", "-std=c11", "-D_GNU_SOURCE", "-Wall"]
ISA_FLAGS: dict[str, list[str]] = {
    "ssse3": ["-mssse3"],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mfma", "-mf16c"],
    "avx512vbmi": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mavx512vbmi", "-mfma", "-mf16c"],
}


def isa_of(source: Path) -> str | None:
    isa = source.stem.rsplit("_", 1)[-1]
    return isa if isa in ISA_FLAGS else None


def compiler() -> str:
    return os.environ.get("CC") or (sysconfig.get_config_var("CC") or "cc").split()[0]


def compile_isa_objects(out_dir: Path, src_dir: Path = HERE, extra_flags: tuple[str, ...] = ()) -> list[Path]:
    """Compile every per-ISA source of src_dir with its own flags (and extra_flags, such as a
    -D for a measurement; give each set of them its own out_dir, as an object newer than its
    sources is kept); returns the object paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("*.o"):   # a renamed or removed source: out_dir/*.o links once
        src = src_dir / f"{stale.stem}.c"
        if not src.exists() and isa_of(src) is not None:
            stale.unlink()
    objects = []
    for src in sorted(src_dir.glob("*.c")):
        isa = isa_of(src)
        if isa is None:
            continue
        obj = out_dir / f"{src.stem}.o"
        if not obj.exists() or obj.stat().st_mtime < max(src.stat().st_mtime, *(
                h.stat().st_mtime for h in src_dir.glob("*.h"))):
            subprocess.run([compiler(), *COMMON_FLAGS, *ISA_FLAGS[isa], *extra_flags, "-c", str(src), "-o", str(obj)],
                           check=True)
        objects.append(obj)
    return objects


def cdef_text() -> str:
    parts = []
    for name in HEADERS:
        text = (HERE / name).read_text()
        m = re.search(r"// ---- FM_CDEF begin\n(.*?)// ---- FM_CDEF end", text, re.S)
        parts.append(m.group(1))
    return "\n".join(parts)


def make_builder() -> FFI:
    ffi = FFI()
    ffi.cdef(cdef_text())
    generic = sorted(str(p.relative_to(HERE.parent.parent)) for p in HERE.glob("*.c") if isa_of(p) is None)
    objects = compile_isa_objects(HERE.parent.parent / "build" / "native_cpu_isa")
    ffi.set_source(
        MODULE,
        "\n".join(f'#include "{h}"' for h in HEADERS),
        sources=generic,
        include_dirs=[str(HERE)],
        extra_compile_args=COMMON_FLAGS[:1] + ["-std=c11", "-D_GNU_SOURCE"],
        extra_objects=[str(o) for o in objects],
        libraries=["m", "pthread"],
    )
    return ffi


ffibuilder = make_builder()
