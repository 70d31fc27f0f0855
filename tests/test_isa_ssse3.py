"""The SSSE3 build holds no AVX: every instruction of the SSSE3 objects, disassembled, uses
neither ymm/zmm registers nor a VEX/EVEX encoding. Where qemu-x86_64 is installed, the SSSE3
kernels also run under qemu-user emulating a pre-AVX CPU (Westmere)."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "native" / "cpu"))
import build as native_build  # noqa: E402

# VEX prefixes are c4/c5, EVEX is 62, as the first opcode byte of an instruction.
VEX_EVEX_FIRST_BYTE = re.compile(r"^\s*[0-9a-f]+:\s+(c4|c5|62)\s")
WIDE_REGISTER = re.compile(r"%[yz]mm\d+|%k[0-7]\b")
AVX_MNEMONIC = re.compile(r"\bv[a-z0-9]+\b")   # every VEX/EVEX instruction's mnemonic starts with v


@pytest.fixture(scope="module")
def isa_objects(tmp_path_factory):
    return native_build.compile_isa_objects(tmp_path_factory.mktemp("isa"))


@pytest.fixture(scope="module")
def ssse3_objects(isa_objects):
    ssse3 = [o for o in isa_objects if o.stem.endswith("_ssse3")]
    assert ssse3, "no *_ssse3.c sources found"
    return ssse3


def disassemble(obj: Path) -> list[str]:
    if not shutil.which("objdump"):
        pytest.skip("objdump (binutils) is not installed")
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(obj)], capture_output=True, text=True, check=True)
    raw = subprocess.run(["objdump", "-d", str(obj)], capture_output=True, text=True, check=True)
    return out.stdout.splitlines() + raw.stdout.splitlines()


def test_ssse3_objects_have_no_avx(ssse3_objects):
    for obj in ssse3_objects:
        lines = disassemble(obj)
        body = [ln for ln in lines if re.match(r"^\s*[0-9a-f]+:", ln)]
        assert len(body) > 50, f"{obj.name}: suspiciously little code"
        bad = [ln for ln in body if WIDE_REGISTER.search(ln) or VEX_EVEX_FIRST_BYTE.match(ln)]
        bad += [ln for ln in body if AVX_MNEMONIC.search(ln.split("\t")[-1])]
        assert not bad, f"{obj.name} holds AVX instructions:\n" + "\n".join(bad[:10])
        mnemonics = " ".join(ln.split("\t")[-1] for ln in body)
        # float dots, DeltaNet, attention, the vision tower
        float_kernel = obj.stem.startswith(("float", "gdn", "attn", "vision"))
        expected = "mulps" if float_kernel else "pmaddubsw"
        assert expected in mnemonics, f"{obj.name}: no {expected}: is it really the SSSE3 kernel?"


def test_the_check_catches_avx(isa_objects):
    """The same check on the AVX2 sibling must fail, or it proves nothing."""
    obj = next(o for o in isa_objects if o.stem == "qx_0_row_avx2")
    body = [ln for ln in disassemble(obj) if re.match(r"^\s*[0-9a-f]+:", ln)]
    assert any(WIDE_REGISTER.search(ln) for ln in body)


def test_ssse3_kernels_run_on_an_emulated_westmere(isa_objects, tmp_path):
    """native/cpu/selftest/selftest.c (plain C: numpy's own wheels need AVX under emulation) on a
    Westmere, which has SSSE3 and no AVX: the best ISA it finds is SSSE3, and every SSSE3 kernel
    agrees with its generic sibling."""
    qemu = shutil.which("qemu-x86_64") or shutil.which("qemu-x86_64-static")
    if not qemu:
        pytest.skip("qemu-user is not installed (apt-get install qemu-user)")
    cpu = REPO / "native" / "cpu"
    sources = [cpu / "selftest" / "selftest.c",
               *(cpu / f"{name}.c" for name in ("dispatch", "quantize", "repack", "ops")),
               *sorted(cpu.glob("*_generic.c"))]
    binary = tmp_path / "selftest"
    subprocess.run([native_build.compiler(), "-O2", f"-I{cpu}", *map(str, sources), *map(str, isa_objects), "-lm",
                    "-o", str(binary)], check=True)
    out = subprocess.run([qemu, "-cpu", "Westmere", str(binary)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "best ISA here: ssse3" in out.stdout and "ssse3 ok" in out.stdout and "avx2" not in out.stdout, out.stdout
    assert out.stdout.strip().endswith("all kernels agree with generic"), out.stdout[-2000:]
