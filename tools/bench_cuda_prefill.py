"""Full-width benchmark of the cuda prefill backend (see fermium/prefill_bench.py).

    python tools/bench_cuda_prefill.py --budget 6GiB --prompts 947 4096 --out bench.json
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fermium.prefill_bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
