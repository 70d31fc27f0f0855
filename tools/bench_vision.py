"""The vision encoder's time for one image at the real tower's widths: the native encoder
(native/vision_runner.py) against the numpy reference (common/reference/vision.py) in the same run,
and llama.cpp's `llama-mtmd-cli` on the same mmproj file where --llama-cpp names its bin folder.

The reference dequantizes the tower to float32 and would take minutes at 27 blocks, so it runs the
tower cut to no block and to 1 (the same file's first); their difference is one block, and its
estimate for the whole tower is t(0) + blocks (t(1) - t(0)), t(0) the patch embedding and the merger
alone. The native encoder runs the whole tower, and the cut ones too, whose output it must match
(printed as the relative error). The machine may be shared: CPU seconds are printed beside the
wall times.

    python tools/bench_vision.py [--mmproj FILE] [--size 1024] [--threads 2] [--llama-cpp BIN_DIR] [--cuda]
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--mmproj", type=Path, help="mmproj GGUF (default: a synthetic f16 one at the real widths, "
                                            "tools/make_synthetic_mmproj.py, written into --workdir)")
ap.add_argument("--size", type=int, default=1024, help="the image's side in pixels")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--workdir", type=Path, default=Path("/tmp/fermium-bench-vision"))
ap.add_argument("--llama-cpp", type=Path, help="llama.cpp's bin folder, with llama-mtmd-cli")
ap.add_argument("--text-model", type=Path, help="text GGUF for llama-mtmd-cli (default: a synthetic 4-layer one "
                                                "as wide as the mmproj's projection)")
ap.add_argument("--skip-reference", action="store_true")
ap.add_argument("--no-native", action="store_true", help="skip the native CPU encoder (and so the reference)")
ap.add_argument("--cuda", action="store_true", help="also time the GPU encoder (native/cuda/vision.py)")
ARGS = ap.parse_args() if __name__ == "__main__" else None
if ARGS is not None:   # the reference's BLAS on as many threads as the native pool, before numpy loads
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(ARGS.threads)

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common.reference.vision import VisionEncoder  # noqa: E402
from common.vision.preprocess import preprocess  # noqa: E402
from common.vision.tensors import BoundVision, MmprojFile  # noqa: E402

REPEATS = 2


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def cut(mmproj: MmprojFile, blocks: int):
    """The tower of its first `blocks` blocks, as the encoders read a file (config and bound)."""
    from dataclasses import replace
    bound = mmproj.bound
    return SimpleNamespace(config=replace(mmproj.config, n_blocks=blocks),
                           bound=BoundVision(bound.globals, bound.blocks[:blocks]))


def synthetic_png(path: Path, side: int) -> Path:
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:side, 0:side].astype(np.float32)
    base = np.stack([255 * x / (side - 1), 255 * y / (side - 1), 127 + 120 * np.sin((x + y) / 7.0)], axis=-1)
    Image.fromarray(np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8)).save(path)
    return path


def text_model(path: Path, hidden: int) -> Path:
    from tools.make_synthetic_gguf import Widths, write_synthetic
    widths = Widths(hidden=hidden, vocab=512, experts=8, experts_used=2, expert_ffn=256, shared_ffn=256, k_heads=2,
                    v_heads=4, head_k=64, head_v=64, heads=2, kv_heads=1, head_dim=128, rope_dim=64)
    return write_synthetic(path, layers=4, recipe="q8_0", widths=widths, byte_tokenizer=True)


def llama_mtmd(bin_dir: Path, text: Path, mmproj: Path, image: Path, threads: int) -> tuple[float, float, list[str]]:
    """(the image's encode in seconds, as it prints it; the whole process's CPU seconds; the command)"""
    cmd = [str(bin_dir / "llama-mtmd-cli"), "-m", str(text), "--mmproj", str(mmproj), "--image", str(image),
           "-p", "describe", "-n", "1", "-t", str(threads), "-c", "4096", "--temp", "0", "--chat-template", "chatml"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    m = re.search(r"mtmd batch encoding done in (\d+) ms", run.stderr + run.stdout)
    if run.returncode or not m:
        raise RuntimeError(f"llama-mtmd-cli failed ({run.returncode}):\n{run.stderr[-2000:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return int(m.group(1)) / 1000, cpu, cmd


def main() -> None:
    args = ARGS
    args.workdir.mkdir(parents=True, exist_ok=True)
    path = args.mmproj
    if path is None:
        path = args.workdir / "mmproj-f16.gguf"
        if not path.exists():
            from tools.make_synthetic_mmproj import write_synthetic_mmproj
            write_synthetic_mmproj(path, "f16")
    mmproj = MmprojFile(path)
    cfg = mmproj.config
    image_path = synthetic_png(args.workdir / f"image-{args.size}.png", args.size)
    with Image.open(image_path) as image:
        patches = preprocess(image, cfg)
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]))
    print(f"mmproj {path}: {cfg.n_blocks} blocks, hidden {cfg.hidden_size}, FFN {cfg.ffn_size}, "
          f"{cfg.n_heads} heads of {cfg.head_dim}, out {cfg.projection_dim}")
    print(f"image {args.size}x{args.size}: {patches.pixels.shape[0]} patches, {patches.n_tokens} tokens")

    wall = run_native(args, mmproj, patches, image_path) if not args.no_native else None
    if args.cuda:
        run_cuda(mmproj, patches, image_path)
    if args.llama_cpp:
        text = args.text_model or args.workdir / f"text-{cfg.projection_dim}.gguf"
        if not text.exists():
            text_model(text, cfg.projection_dim)
        seconds, process_cpu, cmd = llama_mtmd(args.llama_cpp, text, path, image_path, args.threads)
        versus = f"; native is {seconds / wall:.2f}x faster by wall time" if wall else ""
        print(f"llama.cpp llama-mtmd-cli encode: {seconds:8.2f} s wall (its whole process: {process_cpu:.2f} CPU-s, "
              f"loading and warm-up included){versus}")
        print("  its command:", " ".join(cmd))


def warm(encoder, image_path: Path, cfg) -> None:
    with Image.open(image_path) as image:      # pages, pool threads, kernels compiled
        encoder.encode(preprocess(image.resize((64, 64)), cfg))


def run_native(args, mmproj: MmprojFile, patches, image_path: Path) -> float:
    from native.cpu_lib import Pool, active_isa
    from native.vision_runner import NativeVisionEncoder
    cfg = mmproj.config
    pool = Pool(args.threads)
    native = NativeVisionEncoder(mmproj, pool=pool)
    warm(native, image_path, cfg)
    out, wall, cpu = timed(lambda: native.encode(patches))
    assert np.isfinite(out).all()
    print(f"native ({args.threads} threads, ISA {active_isa()}), {cfg.n_blocks} blocks: "
          f"{wall:8.2f} s wall, {cpu:8.2f} CPU-s")
    if args.skip_reference:
        return wall
    # one block = t(1 block) - t(0 blocks): the patch embedding and the merger cancel; the best
    # of REPEATS runs each, as the machine may be shared
    best = {}
    for blocks in (0, 1):
        part = cut(mmproj, blocks)
        reference, ours = VisionEncoder(part), NativeVisionEncoder(part, pool=pool)
        ref, r_wall, r_cpu = min((timed(lambda: reference.encode(patches)) for _ in range(REPEATS)),
                                 key=lambda r: r[1])
        mine, n_wall, _ = min((timed(lambda: ours.encode(patches)) for _ in range(REPEATS)), key=lambda r: r[1])
        best[blocks] = (r_wall, r_cpu, n_wall)
        print(f"cut to {blocks} blocks: reference {r_wall:7.2f} s wall ({r_cpu:.2f} CPU-s), "
              f"native {n_wall:7.2f} s; max |native - reference| / max |reference| = {relative(mine, ref):.2e}")
    block, block_cpu = best[1][0] - best[0][0], best[1][1] - best[0][1]
    estimate, estimate_cpu = best[0][0] + cfg.n_blocks * block, best[0][1] + cfg.n_blocks * block_cpu
    print(f"one block: reference {block:.2f} s wall ({block_cpu:.2f} CPU-s), "
          f"native {best[1][2] - best[0][2]:.2f} s")
    print(f"reference, {cfg.n_blocks} blocks, estimated as t(0) + {cfg.n_blocks} x one block: "
          f"{estimate:8.2f} s wall ({estimate_cpu:.2f} CPU-s); "
          f"native is {estimate / wall:.1f}x faster by wall time, "
          f"{estimate_cpu / cpu:.1f}x by CPU time")
    return wall


def run_cuda(mmproj: MmprojFile, patches, image_path: Path) -> None:
    import pycuda.driver as cuda

    from native.cuda.vision import CudaVisionEncoder, VisionKernels
    cuda.init()
    ctx = cuda.Device(0).make_context()
    try:
        kernels = VisionKernels()
        gpu, load, _ = timed(lambda: CudaVisionEncoder(mmproj, kernels))
        warm(gpu, image_path, mmproj.config)
        runs = [timed(lambda: gpu.encode(patches)) for _ in range(REPEATS)]
        out, wall, _ = min(runs, key=lambda r: r[1])
        assert np.isfinite(out).all()
        print(f"cuda ({cuda.Device(0).name()}), {mmproj.config.n_blocks} blocks: {wall:8.3f} s wall, the best of "
              f"{REPEATS} (the tower's upload, once: {load:.2f} s)")
        gpu.free()
        part = cut(mmproj, 1)
        one = CudaVisionEncoder(part, kernels)
        print(f"cut to 1 block: max |cuda - reference| / max |reference| = "
              f"{relative(one.encode(patches), VisionEncoder(part).encode(patches)):.2e}")
        one.free()
    finally:
        ctx.pop()
        ctx.detach()


def relative(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


if __name__ == "__main__":
    main()
