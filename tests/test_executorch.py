"""Kind ``executorch``: a model's program lowered to a ``.pte`` (XNNPACK, portable),
executed in ExecuTorch's runtime. (Every target together, with transformers as the
reference: tests/test_targets.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import lay_out_project


@pytest.mark.slow
def test_the_portable_kernels_alone(tmp_path: Path) -> None:
    manifest = """\
checkpoints:
  clip: {fixture: clip_vision_tiny}
artifacts:
  portable:
    kind: executorch
    checkpoint: clip
    model_class: CLIPVisionModel
    inputs: {pixel_values: [1, 3, 64, 64]}
    outputs: [pooler_output]
    delegate: portable
"""
    project = lay_out_project(tmp_path, manifest)
    verified = project.doit("verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    delegation = json.loads((tmp_path / "build" / "portable" / "executorch.json").read_text())
    assert (delegation["delegate"], delegation["delegated_nodes"], delegation["delegated_subgraphs"]) == ("portable", 0, 0)
    report = json.loads((tmp_path / "build" / "portable" / "report.json").read_text())
    checks = {check["name"]: check["value"] for check in report["checks"]}
    assert checks["level"] == "ran" and checks["vs_float.pooler_output.cosine"] > 0.9999


# As the fork server does it: the kind's build_imports imported through the server's own
# import, then a worker forked, which runs torch on every core. ``careless_plugin`` stands
# for a plugin's build_imports module that runs torch on every core when imported.
PREPARE_THEN_FORK = """
import os, signal, sys, time
import torch
from edgebuild.kinds.executorch.patterns import INHERITED, _caches, make_patterns
from edgebuild.run.forkserver import _import_quietly
assert not any(cache.cache_info().currsize for cache in _caches())
threads = torch.get_num_threads()
_import_quietly(["edgebuild.kinds.executorch.prepare", "careless_plugin"])
assert "careless_plugin" in sys.modules and torch.get_num_threads() == threads
made = tuple(cache() for cache in _caches())
assert len(made[0]) == 4 and len(made[1]) > 0, made
assert make_patterns() == INHERITED and tuple(cache() for cache in _caches()) == made
child = os.fork()
if child == 0:
    square = torch.randn(1500, 1500)
    (square @ square).sum(), torch.nn.functional.gelu(torch.randn(2_000_000)).sum()
    os._exit(0)
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    if os.waitpid(child, os.WNOHANG)[0]:
        print("the forked worker ran")
        break
    time.sleep(0.2)
else:
    os.kill(child, signal.SIGKILL)
    print("the forked worker hung")
"""
CARELESS_PLUGIN = """
import torch
square = torch.randn(1500, 1500)
(square @ square).sum(), torch.nn.functional.gelu(torch.randn(2_000_000)).sum()
"""


@pytest.mark.slow
def test_the_fork_server_makes_xnnpacks_patterns_before_a_build_and_a_worker_forked_after_runs(tmp_path: Path) -> None:
    """XNNPACK's pattern graphs (seconds to make, kept per process) are made by importing
    the kind's ``build_imports``, which the fork server imports before a build worker (an
    export too) and not before a verification, which never lowers; the next call finds
    them made. Run on several threads, such work (or a plugin's) would leave OpenMP's
    threads started in the server, and a worker forked after it would hang at its first
    parallel region (it did): the server imports on one thread, and puts the count back.
    (A build forked from the server records "inherited": tests/test_targets.py.)"""
    import os
    import subprocess
    import sys

    from edgebuild.kinds.executorch import Executorch
    from edgebuild.run.workers import worker_imports

    assert Executorch.process.build_imports == ("edgebuild.kinds.executorch.prepare",)
    for mode in ("build", "export"):
        assert worker_imports(Executorch, mode) == Executorch.process.worker_imports + Executorch.process.build_imports
    assert worker_imports(Executorch, "verify") == Executorch.process.worker_imports
    (tmp_path / "careless_plugin.py").write_text(CARELESS_PLUGIN)
    done = subprocess.run([sys.executable, "-c", PREPARE_THEN_FORK], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "the forked worker ran", done.stdout + done.stderr[-3000:]


def test_code_digests_cover_exactly_what_builds_and_judges_it() -> None:
    from helpers import assert_code_digests

    common = [
        "edgebuild/kinds/executorch/params.py", "edgebuild/models/fields.py", "edgebuild/models/inputs.py",
        "edgebuild/targets/formats.py", "edgebuild/targets/params.py", "edgebuild/targets/program.py",
    ]
    assert_code_digests(
        "executorch",
        build=[*common,
               "edgebuild/core/runner.py", "edgebuild/kinds/executorch/build.py",
               "edgebuild/kinds/executorch/lowering.py", "edgebuild/kinds/executorch/patterns.py",
               "edgebuild/targets/folding.py"],
        verify=[*common,
                "edgebuild/kinds/executorch/coverage.py", "edgebuild/kinds/executorch/verify.py",
                "edgebuild/targets/judging.py"],
    )


def _tiny_tower_program(depth: int) -> tuple[object, object]:
    """The tiny Qwen3.5 tower (``depth`` blocks) at 64x64 through edgebuild's fixed-shape
    wrapper, exported as the torch_export kind exports it."""
    import torch
    from transformers.models.qwen3_5 import Qwen3_5VisionConfig, Qwen3_5VisionModel

    from edgebuild.models.qwen3_5.model import fixed_shape_tower_class, sample_patches
    from edgebuild.models.qwen3_5.geometry import tower_geometry
    from edgebuild.models.qwen3_5.model import linear_patch_embedding
    from edgebuild.models.qwen3_5.fixtures import QWEN3_5_VL_TINY

    vision = dict(QWEN3_5_VL_TINY["vision_config"], depth=depth)
    torch.manual_seed(0)
    config = Qwen3_5VisionConfig(**vision)
    config._attn_implementation = "sdpa"
    tower = Qwen3_5VisionModel(config).float().eval()
    geometry = tower_geometry(vision, (64, 64))
    tower.patch_embed = linear_patch_embedding(tower.patch_embed)
    wrapper = fixed_shape_tower_class()(tower, geometry).eval()
    (example,) = sample_patches(geometry, 1, 0)
    return torch.export.export(wrapper, (example,)), example


@pytest.mark.slow
def test_the_faster_lowering_writes_the_same_bytes() -> None:
    """``lowering.faster_lowering`` changes how ExecuTorch's private functions do their work,
    not what they make: the tiny tower (one block, from which XNNPACK's partitioner already cuts
    nine subgraphs; three blocks cut 23 and took about twice as long) lowers to the same .pte
    bytes with and without it, and the functions it replaces are ExecuTorch's own again
    afterwards. An ExecuTorch or torch upgrade that changes them fails here (or turns the
    patches off: then say which versions were checked)."""
    import torch.fx.traceback as fx_traceback
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    import executorch.exir.lowered_backend_module as lowered_backend_module
    from edgebuild.kinds.executorch.lowering import faster_lowering, patches_apply

    assert patches_apply(), "the installed executorch/torch are not in lowering.CHECKED: check the patches against them"
    originals = (lowered_backend_module.legalize_graph, fx_traceback.NodeSource.__init__)

    def lowered(faster: bool) -> tuple[bytes, int]:
        program, _ = _tiny_tower_program(depth=1)
        config = EdgeCompileConfig(_check_ir_validity=False)
        if faster:
            with faster_lowering() as on:
                assert on
                edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()], compile_config=config)
                pte = edge.to_executorch().buffer
        else:
            edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()], compile_config=config)
            pte = edge.to_executorch().buffer
        subgraphs = sum(1 for node in edge.exported_program().graph_module.graph.nodes
                        if node.op == "get_attr" and node.name.startswith("lowered_module"))
        return pte, subgraphs

    plain, subgraphs = lowered(faster=False)
    assert subgraphs >= 3, subgraphs
    assert lowered(faster=True)[0] == plain
    assert (lowered_backend_module.legalize_graph, fx_traceback.NodeSource.__init__) == originals


@pytest.mark.slow
def test_numbers_read_from_constants_are_folded_before_lowering() -> None:
    """The tower's ``cu_seqlens`` reads (``aten.item``) are gone from the program ExecuTorch
    lowers, fewer nodes are left outside XNNPACK, and the .pte computes the same numbers; a
    program with a dynamic axis is left as it is."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.devtools.backend_debug import get_delegation_info
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    from edgebuild.kinds.executorch.build import with_constant_scalars_folded

    # One block shows it as well as two: 111 nodes outside XNNPACK unfolded, 42 folded
    # (two blocks: 218 and 80, and the test took 34 s instead of 24).
    program, example = _tiny_tower_program(depth=1)
    folded = with_constant_scalars_folded(program, (example.numpy(),))
    reads = [node for node in folded.graph.nodes if "aten.item" in str(node.target)]
    assert reads == [] and any("aten.item" in str(node.target) for node in program.graph.nodes)

    def run(exported: object, directory: Path) -> tuple[object, int]:
        edge = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])
        outside = get_delegation_info(edge.exported_program().graph_module).num_non_delegated_nodes
        path = directory / "model.pte"
        path.write_bytes(edge.to_executorch().buffer)
        return Runtime.get().load_program(str(path)).load_method("forward").execute([example])[0], outside

    import tempfile

    with tempfile.TemporaryDirectory() as plain_dir, tempfile.TemporaryDirectory() as folded_dir:
        plain_out, plain_outside = run(program, Path(plain_dir))
        folded_out, folded_outside = run(folded, Path(folded_dir))
    assert folded_outside < plain_outside
    assert torch.equal(plain_out, folded_out)

    class Twice(torch.nn.Module):
        def forward(self, x):
            return x * 2

    batch = torch.export.Dim("batch", min=1, max=4)
    dynamic = torch.export.export(Twice(), (torch.ones(2, 3),), dynamic_shapes=({0: batch},))
    assert with_constant_scalars_folded(dynamic, (torch.ones(2, 3).numpy(),)) is dynamic
