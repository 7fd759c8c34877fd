"""The same job in edgebuild, DVC and Olive: quantize a tower to A16W8 QDQ, then run it
again unchanged, with a calibration input touched, and with one changed.

    .venv/bin/python bench/peers.py [--repeats 3]

The job is the default manifest's ``tower_224_qdq`` on the tiny fixture: the 224
tower's float graph (built once by edgebuild, not timed) statically quantized with
onnxruntime's QNN recipe (uint16 activations, uint8 weights, minmax) on the four
shipped calibration images.

- edgebuild: ``doit build tower_224_qdq``, with a fork server per command
  (``EDGEBUILD_FORK_SERVER=process``, the default on CI); then again in a copy of the
  project with the shared fork server (the default elsewhere: the cold run starts it,
  the later ones fork their worker from it).
- DVC: a ``dvc.yaml`` stage running ``get_qnn_qdq_config`` + ``quantize`` (the plain
  script, in this project's interpreter: DVC only decides whether to run it), with the
  float graph, the calibration inputs and the script as its dependencies.
- Olive: a workflow of ``QNNPreprocess`` and ``OnnxStaticQuantization`` (QNN execution
  provider, so Olive calls the same ``get_qnn_qdq_config``), its dataloader a
  ``user_script`` reading the calibration inputs.

DVC and Olive read the calibration inputs as ``.npy`` patches, made from the same
images by edgebuild's own preprocessing; edgebuild reads the images. Each peer is
installed with pip into a virtual environment of its own under the benchmark's work
directory, so this project's dependencies are never touched; a peer that cannot be
installed is skipped with a note. Every command runs in a fresh process; "no-op" is
the median of ``--repeats`` runs. Whether a run rebuilt is read from each tool's own
account: edgebuild's build record, DVC's "Running stage", Olive's pass timing line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SHARED = "edgebuild, shared fork server (the default)"

PER_COMMAND = "edgebuild, a fork server per command (the default on CI)"

PEERS = {
    "dvc": ["dvc"],
    # olive-ai 0.13 imports requests (telemetry) without declaring it.
    "olive": ["olive-ai", "onnxruntime", "onnx", "numpy", "requests"],
}

MANIFEST = """\
checkpoints:
  qwen3_5:
    fixture: qwen3_5_vl_tiny
artifacts:
  tower_224_fp32:
    kind: qwen3_5_vision_tower
    checkpoint: qwen3_5
    image_size: 224
    dtype: fp32
  tower_224_qdq:
    kind: qwen3_5_tower_qdq
    source: tower_224_fp32
    calibration:
      images: [calibration/*.png]
    activation_type: uint16
    weight_type: uint8
"""

PLAIN_SCRIPT = '''\
"""onnxruntime's QNN recipe as one call: what the DVC stage runs."""
import sys
from pathlib import Path

import numpy
from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config


class Reader(CalibrationDataReader):
    def __init__(self, files):
        self.feeds = iter([{"patches": numpy.load(path).astype(numpy.float32)} for path in files])

    def get_next(self):
        return next(self.feeds, None)


model, calibration, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
out.mkdir(parents=True, exist_ok=True)
config = get_qnn_qdq_config(model, Reader(sorted(calibration.glob("*.npy"))),
                            activation_type=QuantType.QUInt16, weight_type=QuantType.QUInt8)
quantize(model, str(out / "model.onnx"), config)
'''

OLIVE_SCRIPT = '''\
"""Olive user_script: the calibration inputs, one .npy file per batch."""
from pathlib import Path

import numpy

from olive.data.registry import Registry


class NpyReader:
    def __init__(self, data_dir):
        self.files = sorted(Path(data_dir).glob("*.npy"))

    def __len__(self):
        return len(self.files)

    def __iter__(self):
        for path in self.files:
            yield {"patches": numpy.load(path).astype(numpy.float32)}


@Registry.register_dataloader()
def npy_calibration(dataset, data_dir, **kwargs):
    return NpyReader(data_dir)
'''


def olive_config(root: Path, model: Path) -> dict:
    return {
        "input_model": {"type": "ONNXModel", "model_path": str(model)},
        "systems": {"qnn": {"type": "LocalSystem",
                            "accelerators": [{"device": "npu", "execution_providers": ["QNNExecutionProvider"]}]}},
        # Not "calibration": Olive takes a name that is also a path in its directory for the path.
        "data_configs": [{"name": "calib_data", "user_script": str(root / "olive_script.py"),
                          "dataloader_config": {"type": "npy_calibration",
                                                "params": {"data_dir": str(root / "npy")}}}],
        "passes": {
            "preprocess": {"type": "QNNPreprocess"},
            # quant_preprocess false: onnxruntime's generic pre-processing would fuse
            # MatMul+Add first, which the QNN recipe does not.
            "quantize": {"type": "OnnxStaticQuantization", "data_config": "calib_data", "quant_format": "QDQ",
                         "activation_type": "uint16", "precision": "uint8", "calibrate_method": "MinMax",
                         "per_channel": False, "prepare_qdq_config": True, "quant_preprocess": False},
        },
        "host": "qnn", "target": "qnn", "log_severity_level": 1, "evaluate_input_model": False,
        "cache_dir": str(root / "olive-cache"), "output_dir": str(root / "olive-out"),
    }


def install(venvs: Path, peer: str) -> tuple[Path | None, str]:
    """The peer's virtual environment (made once, reused), or ``None`` and why not."""
    venv = venvs / peer
    marker = venv / ".installed"
    if marker.exists():
        return venv, marker.read_text()
    shutil.rmtree(venv, ignore_errors=True)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    result = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *PEERS[peer]], capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"`pip install {' '.join(PEERS[peer])}` failed: {last}"
    name = PEERS[peer][0]  # the peer's own distribution comes first
    version = subprocess.run([str(venv / "bin" / "python"), "-c",
                              f"import importlib.metadata as m; print(m.version({name!r}))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    marker.write_text(f"{name} {version}, installed in {time.perf_counter() - started:.0f} s")
    return venv, marker.read_text()


def timed(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, str]:
    started = time.perf_counter()
    result = common.run(command, cwd, env)
    return time.perf_counter() - started, result.stdout + result.stderr


class Job:
    """One tool's run of the job: ``run()`` returns (seconds, whether it rebuilt)."""

    name = ""

    def run(self) -> tuple[float, bool]:
        raise NotImplementedError


class Edgebuild(Job):
    name = "edgebuild"

    def __init__(self, root: Path, env: dict[str, str] | None = None, name: str = "") -> None:
        self.root = root
        self.record = root / "build" / "tower_224_qdq" / ".edgebuild.json"
        self.env = {"EDGEBUILD_REMOTE_CACHE": "off", **(env or {})}
        self.name = name or self.name

    def run(self) -> tuple[float, bool]:
        before = self.record.stat().st_mtime_ns if self.record.exists() else None
        seconds, _ = timed([common.DOIT, "build", "tower_224_qdq"], self.root, self.env)
        return seconds, self.record.stat().st_mtime_ns != before


class Dvc(Job):
    name = "DVC"

    def __init__(self, root: Path, venv: Path) -> None:
        self.root, self.dvc = root, str(venv / "bin" / "dvc")

    def setup(self, model: Path) -> None:
        common.run([self.dvc, "init", "--no-scm", "-q"], self.root)
        common.run([self.dvc, "config", "core.analytics", "false"], self.root)
        graph = model.relative_to(self.root).as_posix()
        command = f"{sys.executable} plain_qdq.py {graph} npy dvc-out"
        common.run([self.dvc, "stage", "add", "-q", "-n", "qdq", "-d", graph, "-d", graph + ".data",
                    "-d", "npy", "-d", "plain_qdq.py", "-o", "dvc-out", command], self.root)

    def run(self) -> tuple[float, bool]:
        seconds, output = timed([self.dvc, "repro"], self.root)
        return seconds, "Running stage" in output


class Olive(Job):
    name = "Olive"

    def __init__(self, root: Path, venv: Path) -> None:
        self.root, self.olive = root, str(venv / "bin" / "olive")
        # CI=1 keeps Olive's telemetry off (it would send a heartbeat first).
        self.env = {"CI": "1", "OLIVE_DISABLE_TELEMETRY": "1", "XDG_CACHE_HOME": str(root / "xdg-cache")}

    def run(self) -> tuple[float, bool]:
        seconds, output = timed([self.olive, "run", "--config", "olive.json", "--tempdir", str(self.root / "tmp")],
                                self.root, self.env)
        return seconds, " finished in " in output


def prepare(root: Path) -> Path:
    """The project, its float tower (built), and the calibration inputs as images and as
    ``.npy`` patches; returns the float graph (copied beside the peers' files)."""
    common.project_dir(root, MANIFEST)
    calibration = root / "calibration"
    calibration.mkdir(exist_ok=True)
    for image in sorted((common.REPO / "data" / "calibration").glob("*.png")):
        shutil.copy2(image, calibration / image.name)
    common.run([common.DOIT, "build", "tower_224_fp32"], root, {"EDGEBUILD_REMOTE_CACHE": "off"})
    sys.path.insert(0, str(common.REPO))
    import numpy

    from edgebuild.models.qwen3_5.inputs import tower_inputs
    from edgebuild.models.qwen3_5.inputs import TowerInputs
    from edgebuild.run.workspace import Workspace

    workspace = Workspace.open(root / "artifacts.yaml", root)
    tower = root / "build" / "tower_224_fp32"
    geometry = json.loads((tower / "tower.json").read_text())["geometry"]
    samples = tower_inputs(TowerInputs(images=["calibration/*.png"]), root, workspace.checkpoint("qwen3_5"), geometry,
                           "calibration")
    (root / "npy").mkdir(exist_ok=True)
    for index, sample in enumerate(samples):
        numpy.save(root / "npy" / f"sample_{index}.npy", sample)
    # In a directory of its own: onnx refuses to write a quantized graph's data file
    # when one of that name is in the working directory.
    (root / "float").mkdir(exist_ok=True)
    for name in ("model.onnx", "model.onnx.data"):
        shutil.copy2(tower / name, root / "float" / name)
    (root / "plain_qdq.py").write_text(PLAIN_SCRIPT)
    (root / "olive_script.py").write_text(OLIVE_SCRIPT)
    (root / "olive.json").write_text(json.dumps(olive_config(root, root / "float" / "model.onnx"), indent=2))
    return root / "float" / "model.onnx"


def rewrite_same_bytes(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data)


def change_image(path: Path, step: int) -> None:
    """One pixel of one calibration image changed, to a value of its own for each ``step``
    (37 is odd: distinct up to 255 steps), so no tool can serve a build it made before."""
    from PIL import Image

    with Image.open(path) as image:
        changed = image.convert("RGB")
    pixel = changed.getpixel((0, 0))
    changed.putpixel((0, 0), tuple((value + 37 * step) % 256 for value in pixel))
    changed.save(path)


def change_npy(path: Path, step: int) -> None:
    """One value of one calibration sample changed, by an amount of its own for each ``step``."""
    import numpy

    sample = numpy.load(path)
    sample.flat[0] += 0.25 * step
    numpy.save(path, sample)


def measure(job: Job, repeats: int, touch: Path, change: Path, changer) -> dict:
    """Cold run, no-op runs, a touched input, changed ones (each a value never built
    before, from the original; then put back)."""
    result = {}
    result["cold"] = job.run()
    noops = [job.run() for _ in range(repeats)]
    result["no-op"] = (statistics.median(seconds for seconds, _ in noops), any(rebuilt for _, rebuilt in noops))
    rewrite_same_bytes(touch)
    result["touched"] = job.run()
    original = change.read_bytes()
    changed = []
    try:
        for step in range(1, repeats + 1):
            change.write_bytes(original)
            changer(change, step)
            changed.append(job.run())
    finally:
        change.write_bytes(original)
    result["changed"] = (statistics.median(seconds for seconds, _ in changed), all(rebuilt for _, rebuilt in changed))
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    # A server per command unless a row names the shared one (which gets a directory of its own).
    os.environ["EDGEBUILD_FORK_SERVER"] = "process"
    # The peers are installed with pip, which byte-compiles them: so is edgebuild.
    common.compile_package(common.REPO / "edgebuild")
    work = common.work_dir() / "peers"
    venvs = work / "venvs"
    venvs.mkdir(parents=True, exist_ok=True)
    root = work / "project"
    shutil.rmtree(root, ignore_errors=True)
    model = prepare(root)
    # The same project again, for edgebuild with a shared fork server: its cold run starts one.
    shared_root = work / "project-shared"
    shutil.rmtree(shared_root, ignore_errors=True)
    shutil.copytree(root, shared_root, symlinks=True)
    image, npy = sorted((root / "calibration").glob("*.png"))[1], sorted((root / "npy").glob("*.npy"))[1]

    results, notes, versions = {}, [], {}
    edgebuild = Edgebuild(root, name=PER_COMMAND)
    results[edgebuild.name] = measure(edgebuild, args.repeats, image, image, change_image)
    servers = Path(tempfile.mkdtemp(prefix="eb-fs-"))  # short: a Unix socket's path is
    try:
        shared = Edgebuild(shared_root, {"EDGEBUILD_FORK_SERVER": "shared", "EDGEBUILD_FORK_SERVER_DIR": str(servers),
                                         "EDGEBUILD_FORK_SERVER_IDLE": "120"}, SHARED)
        shared_image = shared_root / image.relative_to(root)
        results[shared.name] = measure(shared, args.repeats, shared_image, shared_image, change_image)
    finally:
        shutil.rmtree(servers, ignore_errors=True)  # the server retires when its socket is gone
    print(SHARED, json.dumps(results[SHARED]), flush=True)
    for peer, make in (("dvc", Dvc), ("olive", Olive)):
        venv, detail = install(venvs, peer)
        if venv is None:
            notes.append(f"- {peer} was skipped: {detail}.")
            continue
        versions[peer] = detail
        job = make(root, venv)
        if isinstance(job, Dvc):
            job.setup(model)
        try:
            results[job.name] = measure(job, args.repeats, npy, npy, change_npy)
        except RuntimeError as error:
            lines = str(error).strip().splitlines()
            notes.append(f"- {job.name} failed: {lines[0]} ... {lines[-1]}")
        print(job.name, json.dumps(results.get(job.name)), flush=True)

    def cell(entry: tuple[float, bool], expected: bool) -> str:
        seconds, rebuilt = entry
        verdict = "rebuilt" if rebuilt else "kept"
        wrong = " **(wrong)**" if rebuilt != expected else ""
        return f"{seconds:.2f} s, {verdict}{wrong}"

    rows = []
    for name, result in results.items():
        rows.append([name, cell(result["cold"], True), cell(result["no-op"], False), cell(result["touched"], False),
                     cell(result["changed"], True)])
    explained = []
    if "Olive" in results and not results["Olive"]["changed"][1]:
        # What its source says it keys on (olive/cache.py, get_output_model_id).
        explained.append("- Olive keys a pass's result on the input model's content and the pass's configuration, in "
                         "which the dataloader is its name and parameters (a directory path): neither the calibration "
                         "files nor the `user_script` are hashed, so it served the model calibrated on the old input.")
    if "DVC" in results:
        explained.append("- DVC hashes what the stage declares, and only that: an undeclared input (a module the "
                         "script imports, the onnxruntime version) is not checked.")
    edge_noop = results[SHARED]["no-op"][0]
    ratios = [f"{name} {result['no-op'][0] / edge_noop:.1f}x" for name, result in results.items()
              if name not in (PER_COMMAND, SHARED)]
    if "DVC" in results:
        dvc = results["DVC"]
        against_dvc = [
            f"{name}: cold {result['cold'][0] / dvc['cold'][0]:.2f}x, input changed "
            f"{result['changed'][0] / dvc['changed'][0]:.2f}x, no-op {result['no-op'][0] / dvc['no-op'][0]:.2f}x"
            for name, result in results.items() if name in (PER_COMMAND, SHARED)
        ]
    else:
        against_dvc = ["no DVC run"]
    markdown = f"""## Peers: the same job in edgebuild, DVC and Olive (issue: performance)

`.venv/bin/python bench/peers.py --repeats {args.repeats}` on {common.machine()}.
The job: the tiny fixture's 224 tower (float graph built once, not timed) quantized to A16W8 QDQ with onnxruntime's
QNN recipe on the four shipped calibration images; each tool runs it cold, then unchanged ({args.repeats} runs,
median), then with one calibration input rewritten with the same bytes, then with one value of it changed ({args.repeats} runs,
each to a value of its own, median). DVC runs
the plain `get_qnn_qdq_config` + `quantize` script as a stage (the graph, the inputs and the script declared as its
dependencies); Olive runs `QNNPreprocess` + `OnnxStaticQuantization` for the QNN execution provider, its dataloader
a `user_script`. Each peer lives in a virtual environment of its own ({"; ".join(versions.values()) or "none installed"}).
Each cell: wall time of one command (a fresh process), and whether the tool rebuilt (from its own account:
edgebuild's build record, DVC's "Running stage", Olive's pass timing line); **(wrong)** marks a run that rebuilt
what had not changed or kept what had.

{common.table(["tool", "cold", "no-op", "input touched (same bytes)", "input changed (one value)"], rows)}

- No-op vs edgebuild's: {", ".join(ratios) or "no peer measured"}.
- edgebuild's time as a multiple of DVC's: {"; ".join(against_dvc)}.
- edgebuild twice: with `EDGEBUILD_FORK_SERVER=process` (the default where `CI` is set), each command starts a fork
  server of its own, which imports torch and onnxruntime (started as the command plans) before the worker forks; with the shared
  server (the default elsewhere), in a copy of the project, the cold run starts it and every later command forks
  its worker from it instead of importing them again.
{chr(10).join(explained + notes)}
"""
    common.write_section("peers", markdown)
    print(markdown)


if __name__ == "__main__":
    main()
