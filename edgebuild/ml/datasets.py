"""The samples of a dataset gate, read. A gate (``verify: {dataset: ...}``) takes the
user's own images or SafeTensors files, or a set shipped inside an installed package, so
that it runs offline and in CI:

- ``builtin: skimage``: the photos in scikit-image's ``data`` folder (astronaut, camera,
  chelsea, coffee, coins, rocket, ...: every PNG and JPEG there, by name);
- ``builtin: digits``: scikit-learn's 1,797 labelled 8x8 handwritten digits
  (``digits.csv.gz``: 64 grey levels 0-16 and the label per row), as RGB images that
  the checkpoint's image processor scales up to the model's input.

The packages' files are read where they are installed, without importing the
packages (``edgebuild/core/datasets.py`` finds them, and says what a set is by content
for the verification fingerprint).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edgebuild.errors import CheckpointError

if TYPE_CHECKING:
    import numpy
    from PIL import Image

    from edgebuild.core.runner import Feed, TensorSpec
    from edgebuild.core.thresholds import DatasetGate

DIGITS_BYTES = 1 << 20
LABELS_TENSOR = "labels"


@dataclass
class Samples:
    """A dataset as read: images (PIL, RGB) or ready feeds, one integer label per sample
    for a labelled set, and what it is in words."""

    images: "list[Image.Image] | None"
    feeds: "list[Feed] | None"
    labels: list[int] | None
    description: str
    # Label index -> its name, where the set names its labels (directories).
    label_names: list[str] | None = None

    def __len__(self) -> int:
        return len(self.images if self.images is not None else self.feeds or [])


def _subset(count: int, gate: "DatasetGate") -> list[int]:
    """The indices drawn: all of them, or ``gate.samples`` of them at random (seeded), in order."""
    import numpy

    if gate.samples is None or gate.samples >= count:
        return list(range(count))
    return sorted(numpy.random.default_rng(gate.seed).choice(count, gate.samples, replace=False).tolist())


def load_samples(gate: "DatasetGate", files: list[Path], inputs: "list[TensorSpec]") -> Samples:
    """The set's samples: images for the built-in sets and the user's images, feeds for
    the ``inputs`` of the graph from tensors files."""
    from edgebuild.ml.images import load_rgb_image

    if gate.builtin == "digits":
        return _digits(files[0], gate)
    if gate.tensors:
        return _tensor_samples(files, inputs, gate)
    chosen = _subset(len(files), gate)
    images = [load_rgb_image(files[index]) for index in chosen]
    labels = names = None
    if gate.labels == "directory":
        names = sorted({files[index].parent.name for index in chosen})
        labels = [names.index(files[index].parent.name) for index in chosen]
    what = f"builtin:{gate.builtin}" if gate.builtin else "images"
    return Samples(images, None, labels, f"{what} ({_counted(len(chosen), len(files))})", names)


def _counted(taken: int, total: int) -> str:
    return f"{taken} samples" if taken == total else f"{taken} of {total} samples, drawn at random"


def _digits(path: Path, gate: "DatasetGate") -> Samples:
    import gzip
    import io

    import numpy
    from PIL import Image

    from edgebuild.core.files import read_bytes

    rows = numpy.loadtxt(io.BytesIO(gzip.decompress(read_bytes(path, DIGITS_BYTES))), delimiter=",")
    if rows.ndim != 2 or rows.shape[1] != 65:
        raise CheckpointError(f"{path}: expected rows of 64 grey levels and a label, found shape {list(rows.shape)}")
    chosen = _subset(len(rows), gate)
    # Grey levels 0..16 -> 0..255, an 8x8 image per row.
    pixels = numpy.rint(rows[chosen, :64] * (255 / 16)).astype(numpy.uint8).reshape(-1, 8, 8)
    images = [Image.fromarray(digit, mode="L").convert("RGB") for digit in pixels]
    labels = rows[chosen, 64].astype(int).tolist()
    return Samples(images, None, labels, f"builtin:digits ({_counted(len(chosen), len(rows))})")


def _tensor_samples(files: list[Path], inputs: "list[TensorSpec]", gate: "DatasetGate") -> Samples:
    """Feeds from SafeTensors files: a tensor per input, named as the input, of shape
    ``[n, *shape]`` (or ``[n * batch, *shape[1:]]``), and an optional ``labels`` tensor
    ``[n]``; the files' samples one after the other."""
    import numpy
    from safetensors import safe_open

    feeds: list[dict[str, numpy.ndarray]] = []
    labels: list[int] = []
    labelled = None
    for path in files:
        try:
            with safe_open(str(path), framework="np") as handle:
                names = set(handle.keys())
                missing = [spec.name for spec in inputs if spec.name not in names]
                if missing:
                    raise CheckpointError(f"{path}: no tensor {missing[0]!r} for the graph's input of that name "
                                          f"(found {', '.join(sorted(names)) or 'none'})")
                columns = {spec.name: _rows(path, spec, handle.get_tensor(spec.name)) for spec in inputs}
                counts = {len(rows) for rows in columns.values()}
                if len(counts) != 1:
                    raise CheckpointError(f"{path}: the input tensors hold different numbers of samples")
                (count,) = counts
                has_labels = LABELS_TENSOR in names
                if labelled is not None and has_labels != labelled:
                    raise CheckpointError(f"{path}: a '{LABELS_TENSOR}' tensor in some files of the set and not in others")
                labelled = has_labels
                if has_labels:
                    found = handle.get_tensor(LABELS_TENSOR)
                    if found.shape != (count,) or found.dtype.kind not in "iu":
                        raise CheckpointError(f"{path}: tensor '{LABELS_TENSOR}': expected integers of shape [{count}], "
                                              f"found {found.dtype} {list(found.shape)}")
                    labels += found.tolist()
        except (OSError, ValueError) as error:
            raise CheckpointError(f"{path}: not a SafeTensors file ({' '.join(str(error).split())})") from None
        feeds += [{name: rows[index] for name, rows in columns.items()} for index in range(count)]
    chosen = _subset(len(feeds), gate)
    return Samples(None, [feeds[index] for index in chosen], [labels[index] for index in chosen] if labelled else None,
                   f"tensors ({_counted(len(chosen), len(feeds))})")


def _rows(path: Path, spec: "TensorSpec", value: "numpy.ndarray") -> list["numpy.ndarray"]:
    import numpy

    shape = list(spec.shape)
    if None in shape:
        raise CheckpointError(f"{path}: the graph's input {spec.describe()} has no fixed shape to cut samples by")
    if list(value.shape[1:]) == shape:
        stacked = value
    elif list(value.shape[1:]) == shape[1:] and shape and value.shape[0] % shape[0] == 0:
        stacked = value.reshape(-1, *shape)
    else:
        raise CheckpointError(f"{path}: tensor {spec.name!r}: expected shape [n, {', '.join(map(str, shape))}], "
                              f"found {list(value.shape)}")
    return [numpy.ascontiguousarray(row, dtype=spec.dtype) for row in stacked]
