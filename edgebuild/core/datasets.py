"""Which files a dataset gate reads, and what the set is by content. A gate
(``verify: {dataset: ...}``) reads the user's own images or SafeTensors files (paths
or globs relative to the manifest), or the files of a set shipped inside an installed
package, found where the package is installed without importing it.
``edgebuild/ml/datasets.py`` reads them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from edgebuild.core.inputs import expand_inputs
from edgebuild.errors import ParameterError

if TYPE_CHECKING:
    from edgebuild.core.thresholds import DatasetGate

# The built-in sets: the distribution that ships the files, its import name, and where
# the files are inside it.
BUILTIN = {
    "skimage": ("scikit-image", "skimage", "data"),
    "digits": ("scikit-learn", "sklearn", "datasets/data/digits.csv.gz"),
}
# The extra that installs both.
DATASETS_EXTRA = "datasets"
PHOTO_SUFFIXES = (".png", ".jpg", ".jpeg")


def builtin_files(name: str) -> list[Path]:
    """The files of built-in set ``name``, where its package is installed; a
    :class:`ParameterError` naming the extra when it is not."""
    distribution, module, inside = BUILTIN[name]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ParameterError(f"builtin: {name} is shipped inside {distribution}, which is not installed: "
                             f"pip install 'edgebuild[{DATASETS_EXTRA}]'", key="dataset")
    location = Path(next(iter(spec.submodule_search_locations))) / inside
    if name == "digits":
        files = [location] if location.is_file() else []
    else:
        files = sorted(path for path in location.glob("*") if path.suffix.lower() in PHOTO_SUFFIXES and path.is_file())
    if not files:
        raise ParameterError(f"builtin: {name}: {location} holds none of the set's files (a broken {distribution} "
                             "install?)", key="dataset")
    return files


def dataset_files(gate: "DatasetGate", root: Path, where: str) -> list[Path]:
    """Every file the set reads, in order: the built-in set's, or the user's images or
    tensors files (paths or globs relative to ``root``; ``where`` names the key in errors)."""
    if gate.builtin:
        return builtin_files(gate.builtin)
    if gate.images:
        return expand_inputs(gate.images, root, f"{where}.images")
    return expand_inputs(gate.tensors, root, f"{where}.tensors")


def dataset_identity(gate: "DatasetGate", files: list[Path], digest: Callable[[Path], str]) -> dict[str, Any]:
    """What the set is, by content: every file's digest (``digest``, through the stat
    cache), the labels the directories give, and the subset drawn."""
    identity: dict[str, Any] = {"name": gate.name, "files": [digest(path) for path in files],
                                "samples": gate.samples, "seed": gate.seed}
    if gate.labels == "directory":
        identity["labels"] = [path.parent.name for path in files]
    return identity
