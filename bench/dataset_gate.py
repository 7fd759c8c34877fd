"""A dataset gate judged again: the float model's outputs from cache/references vs computed anew.

    .venv/bin/python bench/dataset_gate.py [--samples 200] [--rounds 3]

A CLIP vision encoder the size of ViT-B/32 (12 layers, 768 wide, 224x224, random
weights), exported float32 and quantized A16W8, with a gate on ``builtin: digits``.
After the first verification, the gate's threshold moves (what a user tightening a
gate does) and the QDQ graph is judged again, each round both ways in alternating
order: with the float model's outputs kept in ``cache/references`` (what edgebuild
does), and with that directory emptied first (every judgement computing them, as
without the cache). Each is the wall time of ``doit verify clip_qdq`` in a fresh
process; both write the same intervals (checked).

Goal (issue: verified along the chain): the second gate costs less than the first
(the artifact's side only).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

MANIFEST = """\
checkpoints:
  clip:
    fixture: clip_vision_tiny
    fixture_config: {{hidden_size: 768, intermediate_size: 3072, num_hidden_layers: 12, num_attention_heads: 12,
                      image_size: 224, patch_size: 32, projection_dim: 512}}
artifacts:
  clip:
    kind: hf_onnx
    checkpoint: clip
    model_class: CLIPVisionModel
    inputs: {{pixel_values: [1, 3, 224, 224]}}
    outputs: [pooler_output]
  clip_qdq:
    kind: onnx_qdq
    source: clip
    calibration: {{images: [data/calibration/*.png]}}
    held_out: {{images: [data/held_out/*.png]}}
    verify:
      cosine_min: 0.9
      max_rel: 1.0
      vs_float: {{cosine_min: 0.9, max_rel: 1.0}}
      dataset: {{builtin: digits, samples: {samples}, min_cosine: {gate}}}
"""


def verify_seconds(project: Path, manifest: str, references: bool) -> tuple[float, dict]:
    (project / "artifacts.yaml").write_text(manifest)
    if not references:
        shutil.rmtree(project / "cache" / "references", ignore_errors=True)
    started = time.perf_counter()
    common.run([common.DOIT, "verify", "clip_qdq"], cwd=project, env={"EDGEBUILD_REMOTE_CACHE": "off"})
    elapsed = time.perf_counter() - started
    report = json.loads((project / "build" / "clip_qdq" / "report.json").read_text())
    return elapsed, report["dataset"]["metrics"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    project = common.work_dir() / "dataset_gate"
    shutil.rmtree(project, ignore_errors=True)
    common.project_dir(project, MANIFEST.format(samples=args.samples, gate=0.5))
    shutil.copytree(common.REPO / "data", project / "data")
    common.run([common.DOIT, "build", "clip_qdq"], cwd=project, env={"EDGEBUILD_REMOTE_CACHE": "off"})
    first, metrics = verify_seconds(project, MANIFEST.format(samples=args.samples, gate=0.5), references=False)
    print(f"first gate: {first:.1f} s", flush=True)
    rounds = []
    gate = 0.5
    for index in range(args.rounds):
        times = {}
        for references in ((True, False) if index % 2 == 0 else (False, True)):
            gate += 0.01  # every judgement at another threshold: none is up to date
            elapsed, found = verify_seconds(project, MANIFEST.format(samples=args.samples, gate=round(gate, 2)),
                                            references)
            assert found == metrics, "the cached float outputs must give the same intervals"
            times[references] = elapsed
        rounds.append(times)
        print(f"round {index + 1}: from cache/references {times[True]:.1f} s, computed {times[False]:.1f} s", flush=True)
    cached = statistics.median(entry[True] for entry in rounds)
    computed = statistics.median(entry[False] for entry in rounds)
    ratios = [entry[True] / entry[False] for entry in rounds]
    markdown = f"""## A dataset gate judged again (issue: verified along the chain)

`.venv/bin/python bench/dataset_gate.py --samples {args.samples} --rounds {args.rounds}` on {common.machine()}.
A CLIP vision encoder of ViT-B/32's shape (12 layers, 768 wide, 224x224, random weights) exported
float32 and quantized A16W8 (`onnx_qdq`), with `verify: {{dataset: {{builtin: digits, samples: {args.samples}}}}}`.
After the first gate the threshold moves and `doit verify clip_qdq` judges the QDQ graph again, each round
both ways in alternating order: the float model's outputs from `cache/references` (edgebuild), and with that
directory emptied first (computed anew, as without it). Wall time of the command, medians over the rounds;
every judgement gave the same intervals. Second gate against a gate that computes both sides:
**{statistics.median(ratios):.2f}x** (rounds: {", ".join(f"{ratio:.2f}x" for ratio in ratios)}).

{common.table(["judgement", "seconds"], [
    ["the first gate (both sides computed)", f"{first:.1f}"],
    ["judged again, float outputs from `cache/references`", f"{cached:.1f}"],
    ["judged again, float outputs computed anew", f"{computed:.1f}"],
])}

The float model is transformers' own forward in float32; the artifact's side is onnxruntime on the QDQ graph.
What is kept is keyed by the float model (the checkpoint part the chain's root reads, its parameters, the code
of its `float_model`, the torch and transformers versions) and the inputs' bytes, so an onnxruntime upgrade or a
moved threshold reuses it and a changed checkpoint does not.
"""
    common.write_section("dataset_gate", markdown)
    print(markdown)


if __name__ == "__main__":
    main()
