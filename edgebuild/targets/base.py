"""The base of every kind that lowers a ``torch.export`` program to a target: what it
consumes (:data:`~edgebuild.targets.formats.TORCH_PROGRAM`), the packages it needs and
the extra that installs them, whether it takes dynamic axes. A target kind subclasses it
and adds its lowering and its runtime; everything else a target shares is beside this
module (its parameters, its judgement, the certificates of its formats)."""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import ClassVar, TypeVar

from edgebuild.core.checkpoint import Checkpoint
from edgebuild.core.kind import ArtifactKind, ArtifactParams
from edgebuild.errors import ParameterError
from edgebuild.targets.params import TargetParams
from edgebuild.targets.formats import TORCH_PROGRAM

T = TypeVar("T", bound=TargetParams)


def require_package(module: str, extra: str, kind: str) -> None:
    """:class:`ParameterError` (key ``kind``) naming the extra when ``module`` is not installed."""
    if importlib.util.find_spec(module) is None:
        raise ParameterError(f"the {kind} kind needs {module}, which is not installed: pip install 'edgebuild[{extra}]'",
                             key="kind")


def require_runtime(module: str, extra: str, kind: str) -> None:
    """:func:`require_package`, and ``module`` imports here: a broken install (a native
    library gone, a package of that name shadowing it on ``PYTHONPATH``) is one line naming
    the package, where it was found and its exception, instead of a traceback in the worker
    that imports it."""
    require_package(module, extra, kind)
    problem = import_problem(module)
    if problem is not None:
        spec = importlib.util.find_spec(module)
        found = f" ({spec.origin})" if spec is not None and spec.origin else ""
        raise ParameterError(f"the {kind} kind needs {module}, which is installed{found} but cannot be imported: "
                             f"{problem}", key="kind")


@functools.cache
def import_problem(module: str) -> str | None:
    """Why ``module`` does not import here, on one line (``None`` when it does); tried once
    a process. Only the package itself: its heavy submodules are imported where they are used."""
    try:
        importlib.import_module(module)
    except Exception as error:  # a package's own __init__ may raise anything
        return f"{type(error).__name__}: {' '.join(str(error).split())[:400]}"
    return None


class ProgramTarget(ArtifactKind[T]):
    """A kind that lowers a ``torch.export`` program (a ``source``, or the model described
    inline) and checks it in its own runtime."""

    consumes = (TORCH_PROGRAM,)
    # The modules its lowering and its runtime need, and the extra of edgebuild's that installs them;
    # each is imported by its parameters' check, once a process (a broken install is one line).
    requires: ClassVar[tuple[str, ...]] = ()
    extra: ClassVar[str] = ""
    # Whether it takes a program with dynamic axes (else one fixed shape per program).
    takes_dynamic_shapes: ClassVar[bool] = True

    def check_parameters(self, params: T, checkpoints: dict[str, Checkpoint]) -> None:
        for module in self.requires:
            require_runtime(module, self.extra, self.name)

    def check_sources(self, params: T, sources: dict[str, ArtifactParams]) -> None:
        assert params.source is not None
        if not self.takes_dynamic_shapes and getattr(sources[params.source], "dynamic", False):
            raise ParameterError(f"the {self.name} target takes fixed shapes only, and {params.source!r} declares "
                                 "dynamic axes; fix them, or export one model per shape",
                                 key="inputs" if params.model_class else "source")
