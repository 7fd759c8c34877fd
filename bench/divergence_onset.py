"""The onset rule of ``doit divergence`` on seeded faults and clean chains.

    .venv/bin/python bench/divergence_onset.py [--seeds 20]

For each seed: a tiny CLIP vision encoder of 6 blocks (``clip_vision_tiny``, redrawn with
that seed) exported with ``hf_onnx`` and quantized to 8-bit QDQ (``onnx_qdq``, A8W8 on the
shipped calibration images), then ``doit divergence qdq``. Seeded: two channels of one
block's MLP (block = seed mod 6) made outliers (fc1's rows and bias times 60, fc2's
columns over 60: activations spanning 60 times the rest, which per-tensor 8-bit
quantization cannot hold). Clean: the same model without them (seed + 100). Issue 61 asks
that the onset name the seeded block's module in at least 19 of 20 seeds, never more than
one block away, and that no clean chain names one. Also recorded: the largest step error
(``vs_previous_rel_l2``) of any clean chain and the smallest at a seeded module: the margin
the rule's threshold (``ONSET_REL_L2``) sits in.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

MANIFEST = """\
checkpoints:
  clip: {path: ckpt}
artifacts:
  clip:
    kind: hf_onnx
    checkpoint: clip
    model_class: CLIPVisionModel
    inputs: {pixel_values: [1, 3, 64, 64]}
    outputs: [pooler_output]
  qdq:
    kind: onnx_qdq
    source: clip
    calibration:
      images: [images/*.png]
    held_out:
      images: [held_out/*.png]
"""
BLOCKS = 6
SCALE = 60.0
ENV = {"EDGEBUILD_REMOTE_CACHE": "off"}


def with_outliers(checkpoint: Path, block: int, seed: int) -> None:
    import numpy
    from safetensors.numpy import load_file, save_file

    path = checkpoint / "model.safetensors"
    state = load_file(path)
    prefix = next(key for key in state if key.endswith(f"layers.{block}.mlp.fc1.weight")).removesuffix("fc1.weight")
    fc1, bias, fc2 = (state[prefix + name].copy() for name in ("fc1.weight", "fc1.bias", "fc2.weight"))
    channels = numpy.random.default_rng(seed).choice(fc1.shape[0], 2, replace=False)
    fc1[channels] *= SCALE
    bias[channels] *= SCALE
    fc2[:, channels] /= SCALE
    state |= {prefix + "fc1.weight": fc1, prefix + "fc1.bias": bias, prefix + "fc2.weight": fc2}
    save_file(state, path, metadata={"format": "pt"})


def divergence_of(root: Path, seed: int, block: int | None) -> dict:
    from edgebuild.core.fixtures import write_fixture

    shutil.rmtree(root, ignore_errors=True)
    common.project_dir(root, MANIFEST)
    write_fixture(root / "ckpt", "clip_vision_tiny", {"num_hidden_layers": BLOCKS}, seed)
    if block is not None:
        with_outliers(root / "ckpt", block, seed)
    shutil.copytree(common.REPO / "data" / "calibration", root / "images")
    shutil.copytree(common.REPO / "data" / "held_out", root / "held_out")
    common.run([common.DOIT, "build", "qdq"], cwd=root, env=ENV)
    result = json.loads(common.run([common.DOIT, "divergence", "qdq", "--json"], cwd=root, env=ENV).stdout)
    shutil.rmtree(root, ignore_errors=True)
    return result


def _block(module: str | None) -> int | None:
    parts = (module or "").split(".")
    return int(parts[2]) if len(parts) > 2 and parts[:2] == ["encoder", "layers"] and parts[2].isdigit() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    from edgebuild.run.divergence import ONSET_JUMP, ONSET_REL_L2

    work = common.work_dir() / "divergence_onset"
    rows, named, near, clean_onsets = [], 0, 0, 0
    clean_largest, seeded_smallest = 0.0, float("inf")
    for seed in range(1, args.seeds + 1):
        block = seed % BLOCKS
        seeded = divergence_of(work / "seeded", seed, block)
        clean = divergence_of(work / "clean", seed + 100, None)
        onset = seeded["onset"]
        found = _block(onset["module"]) if onset else None
        named += found == block
        near += found is not None and abs(found - block) <= 1
        clean_onsets += clean["onset"] is not None
        steps = [row for row in clean["hops"][-1]["modules"] if row["vs_previous_rel_l2"] is not None]
        clean_largest = max(clean_largest, max(row["vs_previous_rel_l2"] for row in steps))
        at_fault = [row["vs_previous_rel_l2"] for row in seeded["hops"][-1]["modules"]
                    if row["module"] == f"encoder.layers.{block}.mlp"]
        seeded_smallest = min(seeded_smallest, *at_fault)
        rows.append([seed, f"encoder.layers.{block}.mlp", onset["module"] if onset else "none",
                     f"{onset['vs_previous_rel_l2']:.3f}" if onset else "-", clean["onset"]["module"] if clean["onset"] else "none"])
        print(rows[-1], flush=True)
    markdown = f"""## Where it leaves float: the onset on seeded faults and clean chains (issue 61)

`.venv/bin/python bench/divergence_onset.py --seeds {args.seeds}` on {common.machine()}.

A 6-block tiny CLIP (`clip_vision_tiny`, redrawn per seed) to `hf_onnx` to 8-bit QDQ
(`onnx_qdq`), then `doit divergence qdq`. Seeded: two channels of block (seed mod 6)'s MLP
made outliers (x{SCALE:g} in fc1, /{SCALE:g} in fc2); clean: the same architecture without
them (seed + 100).

{common.table(["seed", "seeded module", "onset named", "its step error", "clean chain's onset"], rows)}

The seeded block named in **{named} of {args.seeds}** seeds, within one block in {near}; clean chains
naming an onset: **{clean_onsets} of {args.seeds}**. The largest step error of any clean chain's
module: {clean_largest:.3f}; the smallest at a seeded MLP: {seeded_smallest:.3f} (the threshold,
`ONSET_REL_L2`, is {ONSET_REL_L2:g}; the jump over the same module in earlier blocks, `ONSET_JUMP`, {ONSET_JUMP:g}).
"""
    common.write_section("divergence_onset", markdown)
    print(markdown)
    if named < args.seeds - 1 or clean_onsets:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
