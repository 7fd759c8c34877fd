"""What warming torch's ONNX exporter up in the fork server saves each later export build.

    .venv/bin/python bench/exporter_warmup.py [--rounds 4] [--forks 3]

Each round is a fresh process that imports what the fork server has imported before it
forks an ``hf_onnx`` build (``PRELOAD`` and the kind's ``worker_imports``: the exporter's
modules and transformers' model code), then, on alternate rounds, imports the kind's
``build_warmups`` as the server does after forking a build (the warm-up: one export of a
small module, on one torch thread). It then forks ``--forks`` workers one after the
other, each exporting the tiny CLIP encoder (two layers, 64x64) with
``edgebuild.ml.onnx_tools.export_onnx`` on two threads, as a build worker forked from the
server does. Every export's bytes must be the same, warm or cold, or the benchmark fails
instead of reporting a time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

ROUND = r"""
import hashlib, json, os, sys, tempfile, time
from pathlib import Path

from edgebuild.kinds.hf_onnx import HfOnnx
from edgebuild.run.forkserver import PRELOAD, _import_quietly

for module in PRELOAD:
    __import__(module)
_import_quietly(HfOnnx.process.worker_imports)
import torch
from transformers import CLIPVisionConfig, CLIPVisionModel
from edgebuild.ml.onnx_tools import export_onnx

warm, forks, scratch = sys.argv[1] == "warm", int(sys.argv[2]), Path(sys.argv[3])
started = time.perf_counter()
if warm:
    _import_quietly(HfOnnx.process.build_warmups)
    assert "edgebuild.ml.exporter_warmup" in sys.modules, "the warm-up failed"
warm_up = time.perf_counter() - started
exports = []
for index in range(forks):
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        torch.set_num_threads(2)
        torch.manual_seed(0)
        config = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  image_size=64, patch_size=16)
        model = CLIPVisionModel(config).eval()
        directory = scratch / f"{sys.argv[1]}-{index}"
        directory.mkdir()
        began = time.perf_counter()
        export_onnx(model, (torch.zeros(1, 3, 64, 64),), directory / "model.onnx", ["pixel_values"], ["pooler_output"], 18)
        seconds = time.perf_counter() - began
        digest = hashlib.sha256(b"".join(path.read_bytes() for path in sorted(directory.iterdir()))).hexdigest()
        os.write(writer, json.dumps({"seconds": seconds, "digest": digest}).encode())
        os._exit(0)
    os.close(writer)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(reader) as answer:
        text = answer.read()
    assert os.waitstatus_to_exitcode(status) == 0 and text, "a forked export failed"
    exports.append(json.loads(text))
print(json.dumps({"warm_up": warm_up, "exports": exports}))
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4, help="processes, alternating cold and warm (default 4)")
    parser.add_argument("--forks", type=int, default=3, help="exports forked one after the other in each (default 3)")
    args = parser.parse_args()
    seconds: dict[str, list[float]] = {"cold": [], "warm": []}
    warm_ups: list[float] = []
    digests = set()
    with tempfile.TemporaryDirectory(prefix="edgebuild-bench-") as scratch:
        for round_index in range(args.rounds):
            side = "cold" if round_index % 2 == 0 else "warm"
            directory = Path(scratch) / str(round_index)
            directory.mkdir()
            done = subprocess.run([sys.executable, "-c", ROUND, side, str(args.forks), str(directory)],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                return 1
            result = json.loads(done.stdout.strip().splitlines()[-1])
            seconds[side] += [export["seconds"] for export in result["exports"]]
            digests |= {export["digest"] for export in result["exports"]}
            if side == "warm":
                warm_ups.append(result["warm_up"])
            print(side, [round(export["seconds"], 2) for export in result["exports"]], flush=True)
    if len(digests) != 1:
        print(f"the exports wrote {len(digests)} different graphs, warm and cold", file=sys.stderr)
        return 1
    cold, warm = statistics.median(seconds["cold"]), statistics.median(seconds["warm"])
    rows = [
        ["cold (forked before any export)", f"{cold:.2f}", " ".join(f"{value:.2f}" for value in seconds["cold"]), "1.00x"],
        ["warm (forked after the warm-up)", f"{warm:.2f}", " ".join(f"{value:.2f}" for value in seconds["warm"]),
         f"{warm / cold:.2f}x"],
    ]
    markdown = "\n".join([
        "## The ONNX exporter warmed up in the fork server (issue 40)",
        "",
        f"`.venv/bin/python bench/exporter_warmup.py --rounds {args.rounds} --forks {args.forks}` on {common.machine()}.",
        "The tiny CLIP encoder exported by `export_onnx` in workers forked one after the other from a process that",
        "imported what the fork server imports before an `hf_onnx` build; on alternate rounds that process first",
        "imported the kind's `build_warmups`, as the server does just after it forks a build. Every export wrote the",
        "same bytes (checked, or the benchmark fails).",
        "",
        common.table(["worker", "export, median (s)", "each (s)", "vs cold"], rows),
        "",
        f"The warm-up itself, in the server, beside the build it was forked for: median "
        f"{statistics.median(warm_ups):.2f} s.",
    ])
    common.write_section("exporter_warmup", markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
