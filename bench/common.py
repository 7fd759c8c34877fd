"""Shared pieces of the benchmarks: synthetic full-size checkpoints, timing, results.

Every benchmark writes its section to ``bench/results/<name>.md``;
``BENCHMARKS.md`` is regenerated from all sections after each run, so each
benchmark can run alone and the file always holds the latest of each.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DOIT = str(Path(sys.executable).with_name("doit"))

# The real Qwen3.5 vision tower (depth 27, hidden 1152, 16 heads, intermediate 4304,
# patch 16, merge 2, out_hidden 5120): ~461 M parameters.
QWEN3_5_VISION = {
    "depth": 27,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_heads": 16,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "in_channels": 3,
    "out_hidden_size": 5120,
    "num_position_embeddings": 2304,
    "hidden_act": "gelu_pytorch_tanh",
}


def work_dir() -> Path:
    """Where benchmarks keep their multi-GB inputs between runs (EDGEBUILD_BENCH_DIR)."""
    path = Path(os.environ.get("EDGEBUILD_BENCH_DIR") or Path(tempfile.gettempdir()) / "edgebuild-bench")
    path.mkdir(parents=True, exist_ok=True)
    return path


def machine() -> str:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({cpu}), {memory:.0f} GiB RAM, Python {platform.python_version()}"


def median_time(function: Callable[[], Any], repeats: int = 5) -> tuple[float, list[float]]:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples), samples


def compile_package(package: Path) -> None:
    """Byte-compile ``package`` now, as an install does: where PYTHONDONTWRITEBYTECODE is set,
    a package never imported before would be compiled again by every command timed (0.1 s
    of a one-artifact `doit list`, a few tenths of a build: the parent, the fork server
    and the worker each compile what they import), and one side of a comparison would
    pay it."""
    import compileall

    compileall.compile_dir(str(package), quiet=1)


def drop_page_cache() -> bool:
    """Make the next read come from disk (needs root; says whether it worked)."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def project_dir(path: Path, manifest: str) -> Path:
    """A user-style project directory: dodo.py and a manifest (the doit commands come
    from the installed package)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "dodo.py").write_text((REPO / "dodo.py").read_text())
    (path / "artifacts.yaml").write_text(manifest)
    return path


# --- synthetic checkpoints ------------------------------------------------------


def _write_safetensors(path: Path, tensors: list[tuple[str, str, tuple[int, ...], Callable[[Any], None]]]) -> dict[str, int]:
    """Stream a SafeTensors file: ``(name, dtype, shape, write_bytes(handle))`` in
    file order. Returns each tensor's byte size. Never holds a whole shard in memory."""
    sizes = {"BF16": 2, "F32": 4, "F16": 2}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape, _ in tensors:
        count = 1
        for dimension in shape:
            count *= dimension
        nbytes = count * sizes[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for name, _, _, write in tensors:
            start = handle.tell()
            write(handle)
            expected = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            assert handle.tell() - start == expected, name
    return {name: header[name]["data_offsets"][1] - header[name]["data_offsets"][0] for name, *_ in tensors}


def _filler(nbytes: int, seed: int) -> Callable[[Any], None]:
    """Bytes for a tensor nobody loads: a repeated random block (hashing speed does
    not depend on content, and bf16 garbage is fine where nothing computes)."""
    import numpy

    block = numpy.random.default_rng(seed).integers(0, 256, 64 * 2**20, dtype=numpy.uint8).tobytes()

    def write(handle: Any) -> None:
        remaining = nbytes
        while remaining:
            chunk = block[: min(len(block), remaining)]
            handle.write(chunk)
            remaining -= len(chunk)

    return write


def write_qwen3_5_checkpoint(directory: Path, non_visual_gib: float = 8.0, vision: dict[str, Any] | None = None) -> Path:
    """A Qwen3.5 VL checkpoint with the real tower shape in a shard shared with
    multi-GB ``lm_head`` / ``embed_tokens``, a second shard, and an index.

    Tower weights are real numbers (seeded normal, transformers' init scale) so the
    tower can be exported; non-visual tensors are filler. Idempotent.
    """
    import torch
    from transformers.models.qwen3_5 import Qwen3_5VisionConfig, Qwen3_5VisionModel

    vision = vision or QWEN3_5_VISION
    done = directory / ".complete"
    if done.exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        tower = Qwen3_5VisionModel(Qwen3_5VisionConfig(**vision))
    shapes = {f"model.visual.{name}": tuple(tensor.shape) for name, tensor in tower.state_dict().items()}
    generator = torch.Generator().manual_seed(0)

    def visual(name: str, shape: tuple[int, ...]) -> Callable[[Any], None]:
        def write(handle: Any) -> None:
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name.endswith("norm.weight"):
                values = torch.ones(shape)
            elif len(shape) == 1:
                values = torch.zeros(shape)
            else:
                values = torch.randn(shape, generator=generator) * 0.02
            handle.write(values.to(torch.bfloat16).view(torch.uint16).numpy().tobytes())

        return write

    vocabulary, width = 248320, 5120
    share = int(non_visual_gib * 2**30 * 0.6) // (2 * 2 * width)  # rows of lm_head and embed_tokens
    shard_one = [(name, "BF16", shape, visual(name, shape)) for name, shape in sorted(shapes.items())]
    shard_one += [
        ("lm_head.weight", "BF16", (max(share, 1), width), _filler(max(share, 1) * width * 2, 1)),
        ("model.language_model.embed_tokens.weight", "BF16", (max(share, 1), width), _filler(max(share, 1) * width * 2, 2)),
    ]
    rest_rows = int(non_visual_gib * 2**30 * 0.4) // (2 * width * 4)
    shard_two = [
        (f"model.language_model.layers.{index}.mlp.up_proj.weight", "BF16", (rest_rows, width), _filler(rest_rows * width * 2, 10 + index))
        for index in range(4)
    ]
    names = {"model-00001-of-00002.safetensors": shard_one, "model-00002-of-00002.safetensors": shard_two}
    weight_map, total = {}, 0
    for filename, tensors in names.items():
        sizes = _write_safetensors(directory / filename, tensors)
        total += sum(sizes.values())
        weight_map.update({name: filename for name in sizes})
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
    )
    config = {
        "model_type": "qwen3_5",
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "vision_config": dict(vision, model_type="qwen3_5_vision"),
        "text_config": {"model_type": "qwen3_5_text", "hidden_size": width, "vocab_size": vocabulary},
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    done.write_text("")
    del vocabulary
    return directory


# --- results -----------------------------------------------------------------------


def write_section(name: str, markdown: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.md").write_text(markdown.rstrip() + "\n")
    assemble()


def assemble() -> None:
    """BENCHMARKS.md = a header + every section in bench/results, in a fixed order."""
    order = ["noop_fingerprint", "tower_export", "qdq_tower", "siglip_gptq", "store_copy", "parallel_matrix", "numba_cache",
             "worker_memory", "worker_startup", "wrapper_check_dtype", "scale_matrix", "many_artifacts", "verify_many", "cache_pull", "peers",
             "dataset_gate", "targets", "stat_cache", "exporter_warmup"]
    sections = sorted(RESULTS.glob("*.md"), key=lambda path: (order.index(path.stem) if path.stem in order else 99, path.stem))
    text = [
        "# Benchmarks",
        "",
        "Measured on the project's development machine; every number comes from the",
        "command quoted in its section (`bench/run_all.py` runs them all). Timings are",
        "medians of repeated runs and targets are ratios against a baseline measured in",
        "the same run, because these machines are noisy.",
        "",
    ]
    for path in sections:
        text.append(path.read_text().rstrip())
        text.append("")
    (REPO / "BENCHMARKS.md").write_text("\n".join(text))


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def rss() -> int:
    """This process's resident set size in bytes (0 where /proc is missing)."""
    return _status_bytes("VmRSS")


def peak_rss() -> int:
    """This process's peak resident set size in bytes (VmHWM; 0 where /proc is missing).

    Not ``getrusage``'s ``ru_maxrss``: Linux carries that across ``execve`` from the
    process that was forked, so a child started by a benchmark holding gigabytes
    reports the benchmark's size as its own peak.
    """
    return _status_bytes("VmHWM")


class RssSampler(threading.Thread):
    """Samples this process's RSS every 20 ms; ``peaks`` holds the peak per ``phase``,
    which the benchmark sets as it goes."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.phase = "start"
        self.peaks: dict[str, int] = {}
        self.running = True

    def run(self) -> None:
        while self.running:
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), rss())
            time.sleep(0.02)
