"""The tower's wrapper check in float16 (as before) vs float32 (as the build runs it now),
on the full-size synthetic tower at 448.

    .venv/bin/python bench/wrapper_check_dtype.py

Each side in a fresh process: load the tower in the check's dtype, build the fixed-shape
wrapper, run both it and ``Qwen3_5VisionModel.forward`` on one input (what the build's
``wrapper_check`` phase does); for float32 also the cast to float16 that follows. Peak RSS
is the process's VmHWM.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SIDE = textwrap.dedent('''
    import json, sys, time
    import torch
    from edgebuild.core.checkpoint import Checkpoint
    from edgebuild.kinds.qwen3_5_tower.build import _cast_weights, _check_wrapper
    from edgebuild.models.qwen3_5.model import fixed_shape_tower_class, load_tower, sample_patches
    from edgebuild.models.qwen3_5.geometry import tower_geometry

    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024

    dtype_name, directory = sys.argv[1:3]
    checkpoint = Checkpoint(directory)
    geometry = tower_geometry(checkpoint.config_section("vision_config"), (448, 448))
    out = {}
    started = time.perf_counter()
    tower = load_tower(checkpoint, getattr(torch, dtype_name))
    out["load_s"] = time.perf_counter() - started
    started = time.perf_counter()
    if dtype_name == "float32":
        module, example, identical, max_abs = _check_wrapper(tower, geometry)
    else:
        module = fixed_shape_tower_class()(tower, geometry).eval()
        example = sample_patches(geometry, 1, seed=0)[0].to(torch.float16)
        with torch.no_grad():
            wrapped = module(example)
            reference = tower(example, torch.tensor([geometry.grid_thw])).pooler_output
        identical = torch.equal(wrapped, reference)
        max_abs = (wrapped.float() - reference.float()).abs().max().item()
    out["check_s"] = time.perf_counter() - started
    out["identical"], out["max_abs"] = bool(identical), max_abs
    if dtype_name == "float32":
        started = time.perf_counter()
        del module
        fixed_shape_tower_class()(_cast_weights(tower, torch.float16), geometry)
        out["cast_s"] = time.perf_counter() - started
    out["peak"] = hwm()
    print("RESULT " + json.dumps(out))
''')


def main() -> None:
    directory = common.write_qwen3_5_checkpoint(common.work_dir() / "qwen3_5_synthetic_scale", non_visual_gib=0.02)
    results = {}
    for dtype in ("float16", "float32"):
        done = subprocess.run([sys.executable, "-c", SIDE, dtype, str(directory)], capture_output=True, text=True)
        line = next((line for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
        if line is None:
            raise SystemExit(f"{dtype} failed:\n{done.stdout}\n{done.stderr}")
        results[dtype] = json.loads(line[len("RESULT "):])
    print(json.dumps(results, indent=2))
    half, single = results["float16"], results["float32"]
    rows = [
        ["float16 (before)", f"{half['load_s']:.1f}", f"{half['check_s']:.1f}", "", f"{half['peak'] / 2**30:.2f}",
         f"identical={half['identical']}, max abs {half['max_abs']:.2e}"],
        ["float32, then cast (now)", f"{single['load_s']:.1f}", f"{single['check_s']:.1f}", f"{single['cast_s']:.1f}",
         f"{single['peak'] / 2**30:.2f}", f"identical={single['identical']}, max abs {single['max_abs']:.2e}"],
    ]
    markdown = f"""## The float16 tower's wrapper check in float32 (issue: scale past one machine)

`.venv/bin/python bench/wrapper_check_dtype.py` on {common.machine()}, shared with other jobs (single runs).
The full-size synthetic tower (461 M parameters) at 448: load, the wrapper check (wrapper and
`Qwen3_5VisionModel.forward` on one input), and for float32 the cast to float16 that the build does next.

{common.table(["check", "load (s)", "check (s)", "cast (s)", "peak RSS (GiB)", "result"], rows)}

The float16 module exported after the float32 check is the same module, weight for weight and buffer for
buffer, as loading in float16 gives (`tests/test_qwen3_5_tower.py::test_float16_module_cast_after_the_float32_check_is_the_float16_load`),
and the tiny tower's float16 graph comes out byte-identical; the price is the float32 weights in memory during
load and check (the float32 build's peak) instead of float16's.
"""
    common.write_section("wrapper_check_dtype", markdown)
    print(markdown)


if __name__ == "__main__":
    main()
