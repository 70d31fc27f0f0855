#!/usr/bin/env bash
# A kernel change measured as a ratio in one run: the native/cpu of git revision REV against
# the working tree's, on the same weight matrix, alternating the two builds REPS times.
#   tools/ab_matvec.sh REV TENSOR BATCH THREADS MODEL [MODEL...]
# e.g. tools/ab_matvec.sh HEAD~1 output.weight 4 2 /tmp/syn-q4_0.gguf /tmp/syn-q4_k_m.gguf
# TENSOR is read from each MODEL in turn (give two where the last-level cache is large); it must
# have the same type and shape in all. FERMIUM_ISA forces the kernels; REPS (default 5) and
# ITERS (matvecs per run, default 4) set the length.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 5 ]] || { sed -n 2,8p "$0"; exit 2; }
REV=$1 TENSOR=$2 BATCH=$3 THREADS=$4; shift 4
REPS=${REPS:-5} ITERS=${ITERS:-4} PYTHON=${PYTHON:-python3}
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
build() {   # source dir, output binary; the per-ISA files with the package build's flags
    local lists objs generic
    mapfile -t lists < <("$PYTHON" - "$WORK/$(basename "$2").objs" "$1" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "native/cpu")
import build
out, src = Path(sys.argv[1]), Path(sys.argv[2])
print(" ".join(map(str, build.compile_isa_objects(out, src))))
print(" ".join(str(p) for p in sorted(src.glob("*.c")) if build.isa_of(p) is None))
PY
)
    read -ra objs <<< "${lists[0]}"
    read -ra generic <<< "${lists[1]}"
    for src in "${generic[@]}"; do
        objs+=("$WORK/$(basename "$2").objs/$(basename "$src" .c).o")
        cc -O2 -std=c11 -D_GNU_SOURCE -I"$1" -c "$src" -o "${objs[-1]}"
    done
    cc -O2 -D_GNU_SOURCE -I"$1" tools/ab_matvec.c "${objs[@]}" -lm -lpthread -o "$2"
}
mkdir -p "$WORK/base"
git archive "$REV" native/cpu native/iq_tables.h | tar -x -C "$WORK/base"   # the kernels and the i-quant tables they include
build "$WORK/base/native/cpu" "$WORK/base.bin"
build native/cpu "$WORK/work.bin"
read -r TYPE ROWS COLS < <("$PYTHON" -c "
import sys, gguf
t = [t for t in gguf.GGUFReader(sys.argv[1]).tensors if t.name == sys.argv[2]][0]
print(int(t.tensor_type), t.shape[1] * (t.shape[2] if len(t.shape) > 2 else 1), t.shape[0])" "$1" "$TENSOR")
FILES=()
for model in "$@"; do
    FILES+=("$model" "$("$PYTHON" -c "
import sys, gguf
print([t for t in gguf.GGUFReader(sys.argv[1]).tensors if t.name == sys.argv[2]][0].data_offset)" "$model" "$TENSOR")")
done
for _ in $(seq "$REPS"); do
    for side in base work; do
        echo "$side $("$WORK/$side.bin" "$TYPE" "$ROWS" "$COLS" "$BATCH" "$THREADS" "$ITERS" "${FILES[@]}")"
    done
done > "$WORK/runs.txt"
echo "\$ ${FERMIUM_ISA:+FERMIUM_ISA=$FERMIUM_ISA }REPS=$REPS ITERS=$ITERS tools/ab_matvec.sh $REV $TENSOR $BATCH $THREADS $*"
"$PYTHON" - "$WORK/runs.txt" "$REV" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    side, mean, best, bw = line.split()
    runs.setdefault(side, []).append((float(mean), float(bw)))
for side, label in (("base", sys.argv[2]), ("work", "working tree")):
    r = runs[side]
    print(f"{label:>14s}: {statistics.median(m for m, _ in r):6.2f} GB/s of weights, "
          f"{statistics.median(m / b for m, b in r):.3f} of the bandwidth measured after each run")
ratio = statistics.median(w[0] / b[0] for w, b in zip(runs["work"], runs["base"]))
print(f"working tree / {sys.argv[2]}, run by run: {ratio:.3f}x")
PY
