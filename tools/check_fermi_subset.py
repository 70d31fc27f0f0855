"""Check that every CUDA kernel in native/cuda stays inside the Fermi (compute 2.0) subset.

nvcc 13 cannot target sm_20, so the subset is enforced on what nvcc emits for the lowest
target it accepts (sm_75): each .cu is compiled to PTX and scanned for forbidden instructions,
and that PTX is assembled with `ptxas -v` under -maxrregcount=63 to read registers and static
shared memory per kernel. Exit status 1 lists every violation.

    python tools/check_fermi_subset.py [--nvcc PATH] [--arch sm_75] [files.cu ...]
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CUDA_DIR = Path(__file__).resolve().parents[1] / "native" / "cuda"
MAX_REGISTERS = 63                   # Fermi's per-thread register file limit
MAX_STATIC_SHARED = 48 * 1024        # Fermi's shared memory per block (48 KB configuration)

# opcode pattern -> why it is outside the subset
FORBIDDEN_OPCODES: dict[str, str] = {
    r"\.(b|)f16(x2)?\b": "half-precision arithmetic",
    r"\.bf16(x2)?\b": "bfloat16 arithmetic",
    r"\.f64\b": "double-precision math (the kernels are fp32 only)",
    r"^(w|wg)?mma\b": "tensor-core matrix instruction",
    r"^dp[24]a\b": "integer dot-product instruction (sm_61+)",
    r"^shfl\b": "warp shuffle (sm_30+)",
    r"^redux\b": "warp reduction (sm_80+)",
    r"^cp\.async\b": "asynchronous copy (sm_80+)",
    r"^ld\.global\.nc\b": "read-only cache load (__ldg, sm_35+)",
    r"^(ldmatrix|stmatrix|movmatrix)\b": "matrix load/store (sm_75+ tensor-core path)",
}
COMPILED = [(re.compile(p), why) for p, why in FORBIDDEN_OPCODES.items()]


@dataclass(frozen=True)
class Violation:
    source: str
    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.source}: {self.where}: {self.what}"


def ptx_instructions(ptx: str):
    """(line number, opcode, text) for every instruction or declaration in a PTX file."""
    for n, line in enumerate(ptx.splitlines(), 1):
        text = line.split("//", 1)[0].strip()
        if not text or text.endswith(":") or text in "{}":
            continue
        text = re.sub(r"^@!?%\w+\s+", "", text)          # predicate guard
        opcode = text.split()[0].rstrip(";")
        yield n, opcode, text


def scan_ptx(source: str, ptx: str) -> list[Violation]:
    out = []
    for n, opcode, text in ptx_instructions(ptx):
        if opcode.startswith(".") and opcode not in (".reg", ".local", ".shared", ".param"):
            continue                                     # directives: .version, .target, .entry ...
        words = [opcode] + ([text.split()[1]] if opcode == ".reg" and len(text.split()) > 1 else [])
        for word in words:
            for pattern, why in COMPILED:
                if pattern.search(word):
                    out.append(Violation(source, f"PTX line {n}", f"{why}: `{text}`"))
    return out


PTXAS_FUNC = re.compile(r"Function properties for (\S+)")


def scan_ptxas(source: str, log: str) -> tuple[list[Violation], dict[str, tuple[int, int]]]:
    """Per-kernel (registers, static shared bytes) from `ptxas -v`, and the limits they break."""
    usage: dict[str, tuple[int, int]] = {}
    spills: dict[str, int] = {}
    func = None
    for line in log.splitlines():
        if m := PTXAS_FUNC.search(line):
            func = m.group(1)
        elif (m := re.search(r"(\d+) bytes stack frame", line)) and func:
            spills[func] = int(m.group(1))
        elif (m := re.search(r"Used (\d+) registers", line)) and func:
            smem = re.search(r"(\d+) bytes smem", line)
            usage[func] = (int(m.group(1)), int(smem.group(1)) if smem else 0)
            func = None
    out = []
    for name, (regs, smem) in usage.items():
        if regs > MAX_REGISTERS:
            out.append(Violation(source, name, f"{regs} registers > {MAX_REGISTERS}"))
        if smem > MAX_STATIC_SHARED:
            out.append(Violation(source, name, f"{smem} bytes static shared > {MAX_STATIC_SHARED}"))
    return out, {name: (*usage[name], spills.get(name, 0)) for name in usage}


def check_file(cu: Path, nvcc: str, arch: str, workdir: Path) -> tuple[list[Violation], dict]:
    flags = [f"-arch={arch}", f"-maxrregcount={MAX_REGISTERS}", "-I", str(cu.parent)]
    ptx, cubin = workdir / (cu.stem + ".ptx"), workdir / (cu.stem + ".cubin")
    ptxas = Path(nvcc).resolve().with_name("ptxas")
    assemble = ([str(ptxas), f"-arch={arch}", f"--maxrregcount={MAX_REGISTERS}", "-v", str(ptx), "-o", str(cubin)]
                if ptxas.exists() else [nvcc, *flags, "-cubin", "-Xptxas", "-v", str(cu), "-o", str(cubin)])
    for cmd in ([nvcc, *flags, "-ptx", str(cu), "-o", str(ptx)], assemble):
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            return [Violation(cu.name, "compile", f"`{' '.join(cmd)}` failed:\n{run.stderr}")], {}
    violations = scan_ptx(cu.name, ptx.read_text())
    more, usage = scan_ptxas(cu.name, run.stderr + run.stdout)
    if not usage:
        more.append(Violation(cu.name, "ptxas", "no kernel found in `ptxas -v` output"))
    return violations + more, usage


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path, help="sources (default: native/cuda/*.cu)")
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "nvcc")
    ap.add_argument("--arch", default="sm_75", help="lowest target nvcc accepts (default sm_75)")
    ap.add_argument("--quiet", action="store_true", help="print violations only")
    args = ap.parse_args(argv)
    files = args.files or sorted(CUDA_DIR.glob("*.cu"))
    if not files:
        print(f"no .cu files under {CUDA_DIR}", file=sys.stderr)
        return 1
    failures: list[Violation] = []
    with tempfile.TemporaryDirectory() as tmp:
        for cu in files:
            bad, usage = check_file(cu, args.nvcc, args.arch, Path(tmp))
            failures += bad
            if not args.quiet:
                for name, (regs, smem, stack) in sorted(usage.items()):
                    print(f"{cu.name:18s} {name:28s} {regs:3d} regs {smem:6d} B smem {stack:4d} B stack")
    for v in failures:
        print(f"FORBIDDEN {v}", file=sys.stderr)
    if not args.quiet:
        print(f"{len(files)} files, {len(failures)} violations")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
