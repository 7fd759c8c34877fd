"""Watch edgebuild rebuild exactly what is stale, with the real doit CLI.

    .venv/bin/python scripts/staleness_demo.py

Creates a throwaway project (a copy of the tiny Qwen3.5 fixture, two tower
artifacts), then walks through the cases below, printing what doit ran and
asserting it. Takes about a minute on two cores.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOIT = str(Path(sys.executable).with_name("doit"))
MANIFEST = """\
checkpoints:
  qwen:
    path: ckpt
artifacts:
  tower_a:
    kind: qwen3_5_vision_tower
    description: {description}
    checkpoint: qwen
    image_size: 64
    opset: {opset}
  tower_b:
    kind: qwen3_5_vision_tower
    checkpoint: qwen
    image_size: [64, 96]
"""


def doit(root: Path, *args: str) -> str:
    result = subprocess.run([DOIT, *args], cwd=root, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"doit {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
    return result.stdout + result.stderr


def ran(output: str) -> dict[str, str]:
    """artifact -> 'built' | 'restored' | 'up to date', from doit's output."""
    states = {}
    for line in output.splitlines():
        for name in ("tower_a", "tower_b"):
            if line.startswith(f"-- {name}"):
                states[name] = "up to date"
            elif line.strip().startswith(f"[{name}] built in"):
                states[name] = "built"
            elif line.strip().startswith(f"[{name}] restored from the store"):
                states[name] = "restored"
            elif line.strip() == f"[{name}] up to date":
                states[name] = "up to date"
    return states


def flip_byte(checkpoint: Path, tensor: str) -> None:
    sys.path.insert(0, str(REPO))
    from edgebuild.core.checkpoint import Checkpoint

    entry = Checkpoint(checkpoint).tensors[tensor]
    with open(entry.file, "r+b") as handle:
        handle.seek(entry.start)
        value = handle.read(1)[0]
        handle.seek(entry.start)
        handle.write(bytes([value ^ 1]))


def step(title: str, root: Path, expected: dict[str, str], *args: str) -> None:
    started = time.perf_counter()
    states = ran(doit(root, "build", *args))
    elapsed = time.perf_counter() - started
    print(f"{title:<52} {states}  ({elapsed:.1f} s)")
    assert states == expected, f"expected {expected}, got {states}"


def main() -> None:
    sys.path.insert(0, str(REPO))
    from edgebuild.core.fixtures import write_fixture

    with tempfile.TemporaryDirectory(prefix="edgebuild-demo-") as scratch:
        root = Path(scratch)
        shutil.copy(REPO / "dodo.py", root)
        write_fixture(root / "ckpt", "qwen3_5_vl_tiny")
        manifest = root / "artifacts.yaml"
        manifest.write_text(MANIFEST.format(description="first", opset=21))
        shard = root / "ckpt" / "model-00001-of-00002.safetensors"

        step("first build", root, {"tower_a": "built", "tower_b": "built"})
        step("no-op", root, {"tower_a": "up to date", "tower_b": "up to date"})
        os.utime(shard)
        step("touch the shard (re-hashed once, nothing built)", root, {"tower_a": "up to date", "tower_b": "up to date"})
        flip_byte(root / "ckpt", "lm_head.weight")
        step("change lm_head.weight in the shared shard", root, {"tower_a": "up to date", "tower_b": "up to date"})
        flip_byte(root / "ckpt", "model.visual.blocks.0.attn.qkv.weight")
        print(doit(root, "status").rstrip())
        step("change a visual tensor", root, {"tower_a": "built", "tower_b": "built"})
        manifest.write_text(MANIFEST.format(description="first", opset=20))
        print(doit(root, "status", "tower_a").rstrip())
        step("opset 21 -> 20 on tower_a", root, {"tower_a": "built", "tower_b": "up to date"})
        manifest.write_text(MANIFEST.format(description="second", opset=20))
        step("change tower_a's description", root, {"tower_a": "up to date", "tower_b": "up to date"})
        manifest.write_text(MANIFEST.format(description="second", opset=21))
        step("opset back to 21 (from the store)", root, {"tower_a": "restored", "tower_b": "up to date"})
        shutil.rmtree(root / "build")
        step("delete build/ (from the store)", root, {"tower_a": "restored", "tower_b": "restored"})

        shutil.rmtree(root / "build")
        shutil.rmtree(root / "cache" / "store")
        process = subprocess.Popen([DOIT, "build", "tower_a"], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        while not any((root / "build" / ".tmp").glob("tower_a~*")):
            time.sleep(0.05)
        time.sleep(1.0)
        process.send_signal(signal.SIGKILL)
        process.wait()
        print(f"{'SIGKILL mid-build, then status':<52} {doit(root, 'status', 'tower_a').strip()}")
        step("build after the kill", root, {"tower_a": "built"}, "tower_a")
    print("every case behaved as expected")


if __name__ == "__main__":
    main()
