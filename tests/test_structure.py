"""The shape of the code (STYLE.md, "What that means here"), checked on every Python file:
no service imports another, `common/` imports no service, the router imports nothing from
`native` (it never loads a kernel), the router's frontends use only what its engine's package
exports (no engine module of their own choosing), the engine imports no HTTP (starlette, uvicorn,
h11, a frontend), the product imports nothing from `tools/` (tools may import the product), and no
Python file outside tests/ passes MAX_LINES. And no circles: no two modules of the product import
each other, however far round, and no two C files of native/cpu or native/cuda include or call
each other (tests/structure_graph.py builds both graphs).

Imports are read with `ast`, so an import inside a function counts as much as one at the top.
"""
from __future__ import annotations

import sys
from pathlib import Path

from tests.structure_graph import C_FOLDERS, PRODUCT, c_graph, circles, imported_modules, python_graph

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 300
SERVICES = ("router", "prefill", "decode")
SKIP_DIRS = {".venv", "build", ".git", "tests", "__pycache__"}
ENGINE = ("services", "router", "engine")
FRONTEND = ("services", "router", "frontend")
HTTP = ("starlette", "uvicorn", "h11")


def python_files() -> list[Path]:
    """Every Python file outside tests/ and build outputs."""
    return sorted(p for p in ROOT.rglob("*.py")
                  if not SKIP_DIRS & set(p.relative_to(ROOT).parts[:-1]) and ".egg-info" not in str(p))


def owner(path: Path) -> str:
    """'services.router', 'common', 'native', 'fermium', 'tools', ...: who a file belongs to."""
    parts = path.relative_to(ROOT).parts
    return f"services.{parts[1]}" if parts[0] == "services" and len(parts) > 2 else parts[0]


def violations() -> list[str]:
    """One line per file and rule broken, naming the first module that breaks it."""
    found: dict[tuple, str] = {}
    for path in python_files():
        me, rel = owner(path), path.relative_to(ROOT)
        for module in sorted(imported_modules(ROOT, path)):
            top = module.split(".")
            theirs = ".".join(top[:2]) if top[0] == "services" and len(top) > 1 else top[0]
            if me.startswith("services.") and theirs.startswith("services.") and theirs != me \
                    and top[1] in SERVICES:
                found.setdefault((rel, 1), f"{rel}: the {me} service imports another service, {module}")
            elif me == "common" and theirs.startswith("services"):
                found.setdefault((rel, 2), f"{rel}: common/ imports a service, {module}")
            elif me == "services.router" and top[0] == "native":
                found.setdefault((rel, 3), f"{rel}: the router imports native code, {module}")
            elif me.split(".")[0] in PRODUCT and top[0] == "tools":
                found.setdefault((rel, 4), f"{rel}: the product imports tools/, {module}")
            elif rel.parts[:3] == FRONTEND and _engine_module(top):
                found.setdefault((rel, 5), f"{rel}: a frontend reaches into the engine, {module}")
            elif rel.parts[:3] == ENGINE and (top[0] in HTTP or tuple(top[:3]) == FRONTEND):
                found.setdefault((rel, 6), f"{rel}: the engine imports HTTP, {module}")
    return list(found.values())


def _engine_module(top: list[str]) -> bool:
    """Whether `top` names a module inside the engine's package, not the package or what it exports."""
    if tuple(top[:3]) != ENGINE or len(top) < 4:
        return False
    inside = ROOT.joinpath(*ENGINE, top[3])
    return inside.is_dir() or inside.with_suffix(".py").exists()


def test_services_and_common_keep_to_their_side():
    assert violations() == []


def test_no_python_file_outside_tests_passes_the_line_limit():
    long = {str(p.relative_to(ROOT)): n for p in python_files() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these files (at most {MAX_LINES} lines each): {long}"


def test_the_check_sees_what_it_must_refuse(tmp_path, monkeypatch):
    """Each rule fires on a file that breaks it, so a passing run means something."""
    bad = {"services/decode/x.py": "from services.router import schema\n",
           "common/y.py": "def f():\n    import services.prefill.server\n",
           "services/router/z.py": "from native import cpu_lib\n",
           "services/router/frontend/f.py": "from ..engine import Engine\nfrom ..engine.dispatch import Dispatcher\n",
           "services/router/frontend/ok.py": "from ..engine import Engine, Request\nfrom .f import x\n",
           "services/router/engine/dispatch.py": "from starlette.requests import Request\n",
           "services/router/engine/ok.py": "from common import state\nfrom .dispatch import Dispatcher\n",
           "services/prefill/ok.py": "from common import state\nfrom . import server\n"}
    for rel, text in bad.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = violations()
    assert len(found) == 5, found
    assert any("decode service imports another" in f for f in found)
    assert any("common/ imports a service" in f for f in found)
    assert any("router imports native" in f for f in found)
    assert any("frontend reaches into the engine, services.router.engine.dispatch" in f for f in found)
    assert any("engine imports HTTP, starlette" in f for f in found)


def test_no_two_modules_of_the_product_import_each_other():
    assert circles(python_graph(ROOT)) == []


def test_no_two_c_files_include_or_call_each_other():
    assert [c for folder in C_FOLDERS for c in circles(c_graph(ROOT, folder))] == []


SYNTHETIC = {
    "common/a.py": "from common import b\n",
    "common/b.py": "def f():\n    from common.a import g\n",
    "common/c.py": "from common import b\n",                       # imports into the circle, not part of it
    "fermium/cli_x.py": "from tools.bench import main\n",
    "tools/bench.py": "from fermium import cli_x\n",                # a tool may import the product
    "native/cpu/ops.h": "static inline float fm_silu(float x) { return x; }\nvoid fm_conv(float *x);\n",
    "native/cpu/ops.c": '#include "ops.h"\n#include "body.h"\nvoid fm_conv(float *x) { body(x); }\n',
    "native/cpu/body.h": '#include "ops.h"\nstatic void body(float *x) { x[0] = fm_silu(x[0]); }\n',
    "native/cpu/engine.c": "int layer(int);\nstatic int (*const LAYERS[])(int) = { layer };\n"
                           "int helper(int n) { return n; }\nint step(int n) { return LAYERS[0](n); }\n",
    "native/cpu/layer.c": "int helper(int n);\nint layer(int n) { return helper(n) + 1; }\n",
    "native/cpu/leaf.c": "int helper(int n);\nstatic int step(int n) { return helper(n); }\n",
}


def test_the_circle_checks_see_what_they_must_refuse(tmp_path, monkeypatch):
    """A Python circle through a function-local import, a C circle through an include of a file's
    own header, one through a function's address, and the product importing tools/: each is
    reported, and what only leads into a circle, or a tool importing the product, is not."""
    for rel, text in SYNTHETIC.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert circles(python_graph(tmp_path)) == ["common.a -> common.b -> common.a"]
    assert circles(c_graph(tmp_path, "native/cpu")) == [
        "native/cpu/body.h -> native/cpu/ops.c -> native/cpu/body.h",
        "native/cpu/engine.c -> native/cpu/layer.c -> native/cpu/engine.c"]
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert violations() == ["fermium/cli_x.py: the product imports tools/, tools.bench"]
