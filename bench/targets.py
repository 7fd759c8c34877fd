"""The full-size Qwen3.5 vision tower at 224 for four targets: edgebuild against the plain scripts.

    .venv/bin/python bench/targets.py [--image-size 224] [--rounds 1]

The plain side is what a user writes without edgebuild: one script per target, run one after
the other, each loading the tower and exporting it itself (ONNX through torch's dynamo
exporter; ExecuTorch, OpenVINO and LiteRT each through its own ``torch.export``). They build
the same modules edgebuild does (``load_tower`` and the fixed-shape wrapper), so the
comparison is of the pipeline, not of the model code. The edgebuild side is one
``doit build`` of the four artifacts in a fresh project with an empty cache: its one
``torch.export`` program feeds the three targets that lower from it.

Memory is sampled every 50 ms over each side's whole process tree (doit, its workers, the
converter's environment); a plain script's peak is its own. Outputs: each edgebuild file
and the plain script's run in their runtime on the same patches, the largest difference
between them printed. A target whose converter fails is reported as such, its attempt
counted on both sides.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

TARGETS = ("onnx", "executorch", "openvino", "litert")
ARTIFACTS = {"onnx": "tower", "executorch": "tower_et", "openvino": "tower_ov", "litert": "tower_tflite"}
FILES = {"onnx": "model.onnx", "executorch": "model.pte", "openvino": "model.xml", "litert": "model.tflite"}


def manifest(checkpoint: Path, image_size: int) -> str:
    return f"""\
checkpoints:
  qwen: {{path: {checkpoint}}}
artifacts:
  tower:
    kind: qwen3_5_vision_tower
    checkpoint: qwen
    image_size: {image_size}
  tower_et: &tower
    kind: executorch
    checkpoint: qwen
    model_class: Qwen3_5VisionModel
    image_size: {image_size}
  tower_ov:
    <<: *tower
    kind: openvino
  tower_tflite:
    <<: *tower
    kind: litert
"""


# --- the plain scripts -----------------------------------------------------------------


def plain_module(checkpoint_dir: Path, image_size: int, for_program: bool) -> tuple[Any, Any]:
    """The tower at the image size and one example, as a user's script builds them."""
    import torch

    from edgebuild.core.checkpoint import Checkpoint
    from edgebuild.models.qwen3_5.model import fixed_shape_tower_class, load_tower, sample_patches
    from edgebuild.models.qwen3_5.geometry import tower_geometry
    from edgebuild.models.qwen3_5.model import linear_patch_embedding

    checkpoint = Checkpoint(checkpoint_dir)
    geometry = tower_geometry(checkpoint.config_section("vision_config"), (image_size, image_size))
    tower = load_tower(checkpoint, torch.float32)
    if for_program:
        # What ExecuTorch and LiteRT need (no 5-D convolution); edgebuild does the same.
        tower.patch_embed = linear_patch_embedding(tower.patch_embed)
    module = fixed_shape_tower_class()(tower, geometry).eval()
    (example,) = sample_patches(geometry, 1, 0)
    return module, example


def plain(target: str, checkpoint_dir: Path, image_size: int, out: Path) -> dict[str, Any]:
    import torch

    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    module, example = plain_module(checkpoint_dir, image_size, for_program=target != "onnx")
    torch.save(example, out / "example.pt")
    if target == "onnx":
        torch.onnx.export(module, (example,), str(out / FILES[target]), input_names=["patches"], output_names=["embeds"],
                          opset_version=18, dynamo=True, optimize=True, external_data=True, verbose=False)
    else:
        program = torch.export.export(module, (example,))
        if target == "executorch":
            from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
            from executorch.exir import to_edge_transform_and_lower

            lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()
            (out / FILES[target]).write_bytes(lowered.buffer)
        elif target == "openvino":
            import openvino

            openvino.save_model(openvino.convert_model(program), str(out / FILES[target]), compress_to_fp16=False)
        else:
            # The converter's own environment (edgebuild's toolenv): the program crosses as a file.
            from edgebuild.targets.program import save_program
            from edgebuild.targets.toolenv import tool_python

            import numpy

            save_program(program, out / "program.pt2")
            numpy.savez(out / "example.npz", **{"0": example.numpy()})
            script = common.REPO / "edgebuild" / "kinds" / "litert" / "convert.py"
            result = subprocess.run([str(tool_python("litert")), str(script), str(out / "program.pt2"),
                                     str(out / "example.npz"), str(out / FILES[target])], capture_output=True, text=True)
            line = (result.stdout.strip().splitlines() or ["{}"])[-1]
            if result.returncode != 0:
                return {"error": json.loads(line).get("error", result.stderr[-400:]),
                        "seconds": time.perf_counter() - started}
    return {"seconds": time.perf_counter() - started}


# --- measuring -----------------------------------------------------------------------


class TreeSampler(threading.Thread):
    """The peak summed RSS of a process and its descendants, every 50 ms."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self.running = True

    def run(self) -> None:
        import psutil

        root = psutil.Process(self.pid)
        while self.running:
            try:
                processes = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            total = 0
            for process in processes:
                try:
                    total += process.memory_info().rss
                except psutil.NoSuchProcess:
                    pass
            self.peak = max(self.peak, total)
            time.sleep(0.05)


def measured(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], float, int]:
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, **(env or {})})
    sampler = TreeSampler(process.pid)
    sampler.start()
    stdout, stderr = process.communicate()
    seconds = time.perf_counter() - started
    sampler.running = False
    sampler.join()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr), seconds, sampler.peak


def outputs_of(target: str, path: Path, example: Any) -> Any:
    """The file run in its own runtime on ``example``."""
    import numpy

    patches = example.numpy()
    if target == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return session.run(None, {session.get_inputs()[0].name: patches})[0]
    if target == "executorch":
        from executorch.runtime import Runtime

        method = Runtime.get().load_program(str(path)).load_method("forward")
        return method.execute([example])[0].numpy()
    if target == "openvino":
        import openvino

        compiled = openvino.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        return numpy.asarray(compiled([patches])[compiled.outputs[0]])
    if target == "litert":
        from ai_edge_litert.interpreter import Interpreter

        interpreter = Interpreter(model_path=str(path))
        interpreter.allocate_tensors()
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], patches)
        interpreter.invoke()
        return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
    raise ValueError(target)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12] if path.is_file() else "-"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--plain", choices=TARGETS, help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--report-only", action="store_true",
                        help="write the report from the last run's measurements (its files are still in the work directory)")
    args = parser.parse_args()
    sys.path.insert(0, str(common.REPO))
    if args.plain:
        print(json.dumps(plain(args.plain, args.checkpoint, args.image_size, args.out)))
        return

    import torch

    work = common.work_dir()
    measurements = work / "targets_rounds.json"
    rounds = json.loads(measurements.read_text()) if args.report_only else []
    checkpoint = None if args.report_only else common.write_qwen3_5_checkpoint(work / "qwen3_5_synthetic")
    for round_index in range(0 if args.report_only else args.rounds):
        plain_root = work / "targets_plain"
        common.run(["rm", "-rf", str(plain_root)], common.REPO)
        plain_results = {}
        for target in TARGETS:
            result, seconds, peak = measured([sys.executable, __file__, "--plain", target, "--checkpoint", str(checkpoint),
                                              "--image-size", str(args.image_size), "--out", str(plain_root / target)],
                                             common.REPO)
            if result.returncode != 0:
                raise RuntimeError(f"plain {target} failed:\n{result.stdout}\n{result.stderr[-3000:]}")
            plain_results[target] = json.loads(result.stdout.strip().splitlines()[-1]) | {"wall": seconds, "peak": peak}
            print("plain", target, plain_results[target], flush=True)
        root = work / "targets_edgebuild"
        common.run(["rm", "-rf", str(root)], common.REPO)
        common.project_dir(root, manifest(checkpoint, args.image_size))
        built, edge_seconds, edge_peak = measured([common.DOIT, "build", *ARTIFACTS.values(), "--continue"], root)
        print("edgebuild", edge_seconds, edge_peak, built.returncode, flush=True)
        rounds.append({"plain": plain_results, "edgebuild": {"wall": edge_seconds, "peak": edge_peak,
                                                             "returncode": built.returncode,
                                                             "log": (built.stdout + built.stderr)[-4000:]}})
        measurements.write_text(json.dumps(rounds))

    last = rounds[-1]
    plain_results = last["plain"]
    root = work / "targets_edgebuild"
    plain_root = work / "targets_plain"
    example = torch.load(plain_root / "onnx" / "example.pt")
    rows = []
    built_targets = []
    for target in TARGETS:
        ours = root / "build" / ARTIFACTS[target] / FILES[target]
        theirs = plain_root / target / FILES[target]
        failed_plain = plain_results[target].get("error")
        if not ours.is_file() or failed_plain:
            rows.append([target, f"{plain_results[target]['wall']:.1f}", f"{plain_results[target]['peak'] / 2**30:.2f}",
                         "built" if ours.is_file() else "failed", "plain: " + (failed_plain or "built")[:120], ""])
            continue
        built_targets.append(target)
        difference = float(abs(outputs_of(target, ours, example) - outputs_of(target, theirs, example)).max())
        same_bytes = digest(ours) == digest(theirs)
        rows.append([target, f"{plain_results[target]['wall']:.1f}", f"{plain_results[target]['peak'] / 2**30:.2f}",
                     "built", "same bytes" if same_bytes else "different bytes", f"{difference:.2e}"])
    # A converter that fails fails on both sides after similar work: both sums keep its attempt.
    plain_sum = sum(plain_results[target]["wall"] for target in TARGETS)
    plain_peak = max(plain_results[target]["peak"] for target in TARGETS)
    edge = last["edgebuild"]
    failed = [target for target in TARGETS if target not in built_targets]
    walls = [round_["edgebuild"]["wall"] / sum(round_["plain"][target]["wall"] for target in TARGETS)
             for round_ in rounds]
    markdown = f"""## One model, four targets: the full-size tower at {args.image_size} (issue: many targets)

`.venv/bin/python bench/targets.py --image-size {args.image_size} --rounds {args.rounds}` on {common.machine()}.
The synthetic Qwen3.5 checkpoint of the no-op benchmark (the real tower shape, 461 M parameters).
Plain: one script per target, run one after the other, each loading the tower and exporting it
itself. edgebuild: `doit build` of the four artifacts in a fresh project, empty cache (one
`torch.export` program lowered by the three targets that take one). Peak memory: the summed RSS
of the whole process tree, sampled every 50 ms. Difference: the largest absolute difference
between the edgebuild file's and the plain script's output, each run in its own runtime on the
same patches.

{common.table(["target", "plain script (s)", "plain peak (GiB)", "edgebuild", "files", "max abs difference"], rows)}

| | time (s) | peak (GiB) |
| --- | --- | --- |
| the four plain scripts, summed / largest peak | {plain_sum:.1f} | {plain_peak / 2**30:.2f} |
| `doit build` of all four | {edge['wall']:.1f} | {edge['peak'] / 2**30:.2f} |

- edgebuild's time is **{edge['wall'] / plain_sum:.2f}x** the plain scripts' summed time (target: at most 0.75x)"""\
        + (f"; per round: {', '.join(f'{ratio:.2f}x' for ratio in walls)}" if len(walls) > 1 else "") + f""",
  and its peak **{edge['peak'] / plain_peak:.2f}x** their largest (target: at most 1.0x). A target whose
  converter fails counts its attempt on both sides.
""" + ("".join(f"- {target} failed: plain: {plain_results[target].get('error', 'built')[:300]}; edgebuild: "
               f"{'built' if (root / 'build' / ARTIFACTS[target] / FILES[target]).is_file() else 'failed'}.\n"
               for target in failed))
    common.write_section("targets", markdown)
    print(markdown)


if __name__ == "__main__":
    main()
