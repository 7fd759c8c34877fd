"""Converting a ``torch.export`` program to a LiteRT ``.tflite``, in the environment that
holds the converter (``edgebuild/targets/toolenv.py``: edgebuild's own, or one of its own).

    python convert.py PROGRAM EXAMPLE_NPZ OUT_TFLITE FOLDING_PY

Imports nothing of edgebuild: the converter's environment need not have it. The example
inputs (an ``.npz`` of arrays ``0``, ``1``, ... in the program's input order) fix the
shapes; ``FOLDING_PY`` is ``edgebuild/targets/folding.py``, loaded by its path. Prints
one JSON line: ``{"ok": true}`` or ``{"error": "..."}``.
"""

from __future__ import annotations

import json
import sys


def convert(program_path: str, example_path: str, out_path: str, folding_path: str) -> None:
    import importlib.util
    import warnings

    import numpy
    import torch

    warnings.filterwarnings("ignore")
    import litert_torch

    program = torch.export.load(program_path)
    with numpy.load(example_path) as arrays:
        example = tuple(torch.from_numpy(arrays[str(index)]) for index in range(len(arrays.files)))
    module = program.module()
    spec = importlib.util.spec_from_file_location("edgebuild_folding", folding_path)
    assert spec is not None and spec.loader is not None
    folding = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(folding)
    folding.fold_constant_scalars(module, example)
    litert_torch.convert(module, example).export(out_path)


def main() -> int:
    program_path, example_path, out_path, folding_path = sys.argv[1:5]
    try:
        convert(program_path, example_path, out_path, folding_path)
    except Exception as error:  # the converter raises what jax and MLIR do
        print(json.dumps({"error": f"{type(error).__name__}: {' '.join(str(error).split())[:400]}"}))
        return 1
    print(json.dumps({"ok": True}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
