"""Time the CUDA vision encoder (native/cuda/vision.py) on one image, in one process, as
tools/gpu_vision_bench.sh alternates it with llama.cpp's llama-mtmd-cli on the same files.

Prints one JSON line: the tower's upload, the first encode of the image (right after a 64x64 warm-up
that compiled and loaded the kernels) and every further encode, in seconds, each timed to the
result on the host; with --check, the largest difference from the numpy reference of the tower cut
to its first block, relative to the reference's largest value.

    python tools/bench_cuda_vision.py --mmproj FILE --image PNG [--encodes 3] [--check] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common.reference.vision import VisionEncoder  # noqa: E402
from common.vision.preprocess import preprocess  # noqa: E402
from common.vision.tensors import BoundVision, MmprojFile  # noqa: E402


def first_block(mmproj: MmprojFile):
    bound = mmproj.bound
    return SimpleNamespace(config=replace(mmproj.config, n_blocks=1),
                           bound=BoundVision(bound.globals, bound.blocks[:1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mmproj", type=Path, required=True)
    ap.add_argument("--image", type=Path, required=True)
    ap.add_argument("--encodes", type=int, default=3, help="encodes of the image, after the warm-up")
    ap.add_argument("--check", action="store_true", help="also compare the first block's tower with the reference")
    ap.add_argument("--json", type=Path, help="also write the JSON line here")
    args = ap.parse_args()

    import pycuda.driver as cuda

    from native.cuda.vision import CudaVisionEncoder, VisionKernels
    mmproj = MmprojFile(args.mmproj)
    with Image.open(args.image) as image:
        patches = preprocess(image, mmproj.config)
        warm = preprocess(image.resize((64, 64)), mmproj.config)
    cuda.init()
    ctx = cuda.Device(0).make_context()
    try:
        kernels = VisionKernels()
        t0 = time.perf_counter()
        encoder = CudaVisionEncoder(mmproj, kernels, max_patches=patches.pixels.shape[0])
        upload = time.perf_counter() - t0
        encoder.encode(warm)
        times = []
        for _ in range(max(1, args.encodes)):
            t0 = time.perf_counter()
            out = encoder.encode(patches)
            times.append(time.perf_counter() - t0)
        assert np.isfinite(out).all()
        result = {"device": cuda.Device(0).name(), "mmproj": str(args.mmproj), "blocks": mmproj.config.n_blocks,
                  "patches": int(patches.pixels.shape[0]), "tokens": int(patches.n_tokens),
                  "upload_s": round(upload, 4), "encode_s": [round(t, 4) for t in times],
                  "best_s": round(min(times), 4), "device_bytes": encoder.nbytes}
        encoder.free()
        if args.check:
            part = first_block(mmproj)
            one = CudaVisionEncoder(part, kernels)
            got, want = one.encode(patches), VisionEncoder(part).encode(patches)
            result["first_block_rel_err"] = float(np.abs(got - want).max() / np.abs(want).max())
            one.free()
    finally:
        ctx.pop()
        ctx.detach()
    line = json.dumps(result)
    print(line)
    if args.json:
        args.json.write_text(line + "\n")


if __name__ == "__main__":
    main()
