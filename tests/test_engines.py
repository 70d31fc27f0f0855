"""The runners and prefill backends by name (common/engines.py), and that each class there provides
its Protocol (common/engine_types.py): every method with a signature that takes the Protocol's
calls, every attribute set. The check reads the classes with inspect and ast, so the cuda backend,
which cannot be made without a GPU, is checked too; where a class can be made here, isinstance
confirms it."""
from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from common.engine_types import PrefillBackend, Runner, SpeculativeRunner
from common.engines import (
    AUTO,
    ENGINES,
    PREFILL,
    RUNNER,
    EngineUnavailableError,
    UnknownEngineError,
    available,
    create_backend,
    engines,
    load_runner,
    names,
    names_text,
)
from common.model.gguf_file import GGUFModel
from tests.stack_helpers import write_tiny_gguf

PROTOCOLS = {RUNNER: SpeculativeRunner, PREFILL: PrefillBackend}


def members(protocol: type) -> tuple[dict[str, object], set[str]]:
    """(name -> the Protocol's method or property, names of its data attributes), its bases' too."""
    methods, data = {}, set()
    for base in reversed(protocol.__mro__):
        if base is object or base.__module__ != "common.engine_types":
            continue
        data |= set(base.__dict__.get("__annotations__", {}))
        methods |= {n: v for n, v in base.__dict__.items() if not n.startswith("_")
                    and (inspect.isfunction(v) or isinstance(v, property))}
    return methods, data


def set_attributes(cls: type) -> set[str]:
    """The names a class defines, or that its methods (its bases' too) assign on self."""
    out = set()
    for klass in cls.__mro__[:-1]:
        out |= set(vars(klass))
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.value, ast.Name) and node.value.id == "self":
                out.add(node.attr)
    return out


def signature_problem(want: inspect.Signature, got: inspect.Signature) -> str | None:
    """Why a method of signature `got` cannot take every call that `want` allows, or None."""
    have = got.parameters
    for name, p in want.parameters.items():
        if name not in have:
            return f"no parameter {name!r}"
        q = have[name]
        if q.kind != p.kind:
            return f"{name!r} is {q.kind.description}, the Protocol's is {p.kind.description}"
        if p.default is not inspect.Parameter.empty and q.default is inspect.Parameter.empty:
            return f"{name!r} has no default"
        if p.default not in (inspect.Parameter.empty, Ellipsis) and q.default != p.default:
            return f"{name!r} defaults to {q.default!r}, the Protocol's to {p.default!r}"
    extra = [n for n, q in have.items() if n not in want.parameters and q.default is inspect.Parameter.empty
             and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD)]
    return f"more required parameters {extra}" if extra else None


def protocol_problems(cls: type, protocol: type) -> list[str]:
    methods, data = members(protocol)
    found, problems = set_attributes(cls), []
    for name, want in methods.items():
        got = inspect.getattr_static(cls, name, None)
        if isinstance(want, property):
            if not isinstance(got, property):
                problems.append(f"{name}: not a property")
        elif not callable(got):
            problems.append(f"{name}: no such method")
        elif why := signature_problem(inspect.signature(want), inspect.signature(got)):
            problems.append(f"{name}: {why}")
    problems += [f"{name}: never set" for name in sorted(data - found)]
    return problems


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.name)
def test_every_registered_class_provides_its_protocol(engine):
    cls = engine.load()              # the cuda backend's module imports without pycuda, which it loads on use
    assert protocol_problems(cls, PROTOCOLS[engine.role]) == []
    assert callable(getattr(cls, "availability", None)), "the registry asks each class availability()"
    assert inspect.signature(cls).parameters, "constructed as cls(model, **options)"


def test_the_in_process_stacks_backend_provides_the_protocol():
    from fermium.local import RunnerBackend
    assert protocol_problems(RunnerBackend, PrefillBackend) == []


def test_the_check_sees_a_class_that_breaks_the_protocol():
    class Bad:
        name = "bad"

        def __init__(self):
            self.kv_type = "f32"

        def prefill(self, tokens, state, all_logits=False):      # positional, and no mm
            return tokens

    problems = protocol_problems(Bad, PrefillBackend)
    assert any(p.startswith("prefill: 'all_logits' is positional or keyword") for p in problems), problems
    assert "stats: no such method" in problems
    assert protocol_problems(Bad, Runner)[-1] == "cfg: never set"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return GGUFModel(str(write_tiny_gguf(tmp_path_factory.mktemp("engines") / "tiny.gguf")))


def test_what_loads_here_is_an_instance_of_its_protocol(tiny):
    for name in engines(RUNNER):
        used, runner = load_runner(name, tiny, threads=1, kv_type="f16")
        assert used == name and isinstance(runner, SpeculativeRunner) and runner.kv_type == "f16"
    backend = create_backend("cpu", tiny, runner="reference")
    assert isinstance(backend, PrefillBackend) and backend.runner_name == "reference"


def test_names_availability_and_refusals(tiny, monkeypatch):
    assert names(RUNNER) == (AUTO, "native", "reference") and names(PREFILL) == ("cpu", "cuda")
    assert names_text(PREFILL) == "cpu or cuda"
    assert available(PREFILL)["cpu"] == (True, "native engine, or numpy where it does not load")
    assert available(RUNNER)["reference"] == (True, "numpy")
    with pytest.raises(UnknownEngineError, match="no prefill backend named 'tpu'; registered: cpu \\(ok\\), cuda"):
        create_backend("tpu", None)
    with pytest.raises(UnknownEngineError, match="no runner named 'gpu'; registered: native .*, and auto"):
        load_runner("gpu", None)
    if not available(PREFILL)["cuda"][0]:
        with pytest.raises(EngineUnavailableError, match="prefill backend 'cuda' is not available here: "):
            create_backend("cuda", tiny)
    native = next(e for e in ENGINES if e.name == "native")
    monkeypatch.setattr(type(native), "availability", lambda self: (False, "no kernels")
                        if self.name == "native" else (True, "numpy"))
    assert load_runner(AUTO, tiny)[0] == "reference"           # auto falls back


def test_the_options_list_the_registered_names():
    from services.decode.config import DecodeConfig
    from services.prefill.config import PrefillConfig
    runner_help = DecodeConfig.__dataclass_fields__["runner"].metadata["help"]
    backend_help = PrefillConfig.__dataclass_fields__["backend"].metadata["help"]
    assert all(n in runner_help for n in names(RUNNER)) and all(n in backend_help for n in names(PREFILL))
