"""The import contract (pyproject.toml, [tool.importlinter]) and the engine's typed seams.

The contract: every package imports only the floors below it, the backends (sim, torch,
vLLM) never import each other, and no two packages, nor two modules of one package,
import each other. The seams: both generation sides satisfy ``GenerationSide``, every
backend inherits ``BackendBase``, and the engine registry knows exactly the engines the
settings accept.
"""
import inspect
import io
import typing
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from specscale.engine.backend import BackendBase, GenerationSide
from specscale.engine.generation import GenerationEngine, ScheduledBackend
from specscale.engine.registry import ENGINES
from specscale.engine.sim.backend import SimBackend
from specscale.engine.torch.backend import TorchBackend
from specscale.engine.torch.synthetic import SyntheticTorchBackend
from specscale.engine.vllm.backend import VLLMBackend
from specscale.engine.vllm.generation import VLLMGeneration
from specscale.settings.parts import ENGINE_NAMES

REPO = Path(__file__).resolve().parents[1]


def test_no_upward_imports_and_no_cycles(monkeypatch):
    from importlinter.cli import lint_imports

    monkeypatch.chdir(REPO)
    out = io.StringIO()
    with redirect_stdout(out):
        rc = lint_imports(config_filename=str(REPO / "pyproject.toml"), no_cache=True, no_logo=True)
    report = out.getvalue()
    assert rc == 0, report
    assert report.count(" KEPT") == 4 and "BROKEN" not in report, report


def _members(proto) -> dict[str, object]:
    """The protocol's methods and attributes (annotations), without typing's own."""
    names = {n for n in vars(proto) if not n.startswith("_")} | set(typing.get_type_hints(proto))
    return {n: getattr(proto, n, None) for n in names}


@pytest.mark.parametrize("impl", [GenerationEngine, VLLMGeneration])
def test_both_generation_sides_satisfy_the_protocol(impl):
    source = inspect.getsource(impl)
    for name, member in _members(GenerationSide).items():
        if callable(member):
            assert callable(getattr(impl, name, None)), f"{impl.__name__} lacks {name}()"
            want = list(inspect.signature(member).parameters)
            got = list(inspect.signature(getattr(impl, name)).parameters)
            assert got == want, f"{impl.__name__}.{name}{got} differs from the protocol's {want}"
        else:  # an attribute: a class attribute, a property, or set on the instance in __init__
            assert hasattr(impl, name) or f"self.{name} =" in source, f"{impl.__name__} lacks .{name}"


@pytest.mark.parametrize("backend", [SimBackend, TorchBackend, SyntheticTorchBackend, VLLMBackend])
def test_every_backend_states_what_it_leaves_out(backend):
    assert issubclass(backend, BackendBase)
    assert callable(getattr(backend, "make_generation_side", None))


def test_the_harness_schedules_sim_and_torch_and_vllm_brings_its_own():
    assert issubclass(SimBackend, ScheduledBackend) and issubclass(TorchBackend, ScheduledBackend)
    assert not issubclass(VLLMBackend, ScheduledBackend)


def test_registry_knows_exactly_the_engines_the_settings_accept():
    assert set(ENGINES) == set(ENGINE_NAMES)
    assert all(callable(build) for build in ENGINES.values())
