"""Shards (edgebuild/shards.py): every artifact in exactly one shard, sources together,
balanced by recorded cost, a stable order without history; the gather step after them;
a read-only remote cache."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from edgebuild.run.costs import LOCK_SOURCE, Cost
from edgebuild.core.lock_format import render_lock
from edgebuild.core.manifest import load_manifest
from edgebuild.cache.remote import RemoteCache
from edgebuild.run.shards import groups, parse_shard, partition, select_shard

from helpers import TOWER_MANIFEST, ProjectDir, clone_project, commit, fresh_clone, pretend_built, signing_env

# Twelve artifacts: six towers, a QDQ tower and its QNN context on one of them, two
# SigLIP encoders and an ONNX graph of one; two chains and eight loners.
MANIFEST = """\
checkpoints:
  qwen:
    fixture: qwen3_5_vl_tiny
  siglip:
    fixture: siglip_tiny
artifacts:
  tower_{image_size}_{dtype}:
    kind: qwen3_5_vision_tower
    checkpoint: qwen
    matrix:
      image_size: [64, 96, 128]
      dtype: [fp32, fp16]
  tower_qdq:
    kind: qwen3_5_tower_qdq
    source: tower_64_fp32
    calibration:
      images: [images/*.png]
  tower_qnn:
    kind: qnn_context
    source: tower_qdq
  siglip_a:
    kind: siglip_f143
    checkpoint: siglip
    calibration:
      images: [images/*.png]
  siglip_b:
    kind: siglip_f143
    checkpoint: siglip
    algorithm: nearest
    calibration:
      images: [images/*.png]
  siglip_a_onnx:
    kind: siglip_f143_onnx
    source: siglip_a
  tower_224:
    kind: qwen3_5_vision_tower
    checkpoint: qwen
    image_size: 224
"""
CHAINS = [["tower_64_fp32", "tower_qdq", "tower_qnn"], ["siglip_a", "siglip_a_onnx"]]


@pytest.fixture
def manifest(tmp_path: Path):
    path = tmp_path / "artifacts.yaml"
    path.write_text(MANIFEST)
    return load_manifest(path)


def seconds(**by_name: float) -> dict[str, Cost]:
    return {name: Cost(value, None, None, LOCK_SOURCE) for name, value in by_name.items()}


def test_parse_shard() -> None:
    assert parse_shard("2/4") == (2, 4)
    assert parse_shard(" 1 / 1 ") == (1, 1)
    for text, message in [
        ("3/2", "--shard: expected 1 <= I <= N, found 3/2"),
        ("0/2", "--shard: expected 1 <= I <= N, found 0/2"),
        ("1-2", "--shard: expected I/N such as 1/2 (shard I of N, ASCII digits), found '1-2'"),
        # Fullwidth (and other Unicode) digits are not a shard.
        ("\uff11/\uff12", "--shard: expected I/N such as 1/2 (shard I of N, ASCII digits), found '\uff11/\uff12'"),
        ("1/2\n", "--shard: expected I/N such as 1/2 (shard I of N, ASCII digits), found '1/2\\n'"),
        # N is bounded before anything is allocated (one list per shard).
        ("1/100000000000", "--shard: expected N at most 1024, found 1/100000000000"),
        ("1/" + "9" * 30, f"--shard: expected I/N such as 1/2 (shard I of N, ASCII digits), found '1/{'9' * 30}'"),
    ]:
        with pytest.raises(ValueError) as caught:
            parse_shard(text)
        assert str(caught.value) == message


def test_groups_keep_source_chains_together(manifest) -> None:
    found = groups(manifest, list(manifest.artifacts))
    assert len(manifest.artifacts) == 12
    assert sorted(map(sorted, found)) == sorted(
        [sorted(chain) for chain in CHAINS] + [[name] for name in manifest.artifacts if not any(name in c for c in CHAINS)]
    )
    # A selection brings in what it consumes.
    assert groups(manifest, ["tower_qnn"]) == [["tower_64_fp32", "tower_qdq", "tower_qnn"]]


@pytest.mark.parametrize("count", [1, 2, 3, 5, 12, 13])
def test_every_artifact_in_exactly_one_shard_with_its_sources(manifest, count: int) -> None:
    shards = partition(groups(manifest, list(manifest.artifacts)), {}, count, verify=False)
    assert len(shards) == count
    everywhere = [name for shard in shards for name in shard]
    assert sorted(everywhere) == sorted(manifest.artifacts)
    for chain in CHAINS:
        assert sum(1 for shard in shards if set(chain) & set(shard)) == 1
    # Without history every artifact weighs the same: shard sizes differ by at most the largest group.
    sizes = [len(shard) for shard in shards]
    assert max(sizes) - min(sizes) <= 3


def test_without_history_the_partition_is_a_stable_hash_order(manifest, tmp_path: Path) -> None:
    shards = partition(groups(manifest, list(manifest.artifacts)), {}, 2, verify=False)
    # The same on every machine and every run (blake3 of the group's names decides ties) ...
    assert shards == [
        ["tower_64_fp32", "tower_qdq", "tower_qnn", "tower_128_fp32", "tower_128_fp16", "siglip_b"],
        ["siglip_a", "siglip_a_onnx", "tower_96_fp16", "tower_64_fp16", "tower_96_fp32", "tower_224"],
    ]
    # ... and whatever order the manifest lists them in.
    reversed_text = MANIFEST.replace(
        "      image_size: [64, 96, 128]\n      dtype: [fp32, fp16]", "      image_size: [128, 96, 64]\n      dtype: [fp16, fp32]"
    )
    (tmp_path / "reordered.yaml").write_text(reversed_text)
    reordered = load_manifest(tmp_path / "reordered.yaml")
    again = partition(groups(reordered, list(reordered.artifacts)), {}, 2, verify=False)
    assert [sorted(shard) for shard in again] == [sorted(shard) for shard in shards]


def test_balanced_by_recorded_cost(manifest) -> None:
    # One slow chain and quick loners: the chain gets a shard to itself.
    costs = seconds(tower_64_fp32=40, tower_qdq=100, tower_qnn=60, siglip_a=30, siglip_a_onnx=20, tower_224=30)
    costs |= {name: Cost(10, 5, None, LOCK_SOURCE) for name in ["tower_96_fp32", "tower_96_fp16", "tower_128_fp32",
                                                               "tower_128_fp16", "tower_64_fp16", "siglip_b"]}
    shards = partition(groups(manifest, list(manifest.artifacts)), costs, 2, verify=False)
    assert sorted(shards[0]) == ["tower_64_fp32", "tower_qdq", "tower_qnn"]
    assert len(shards[1]) == 9
    # With verification seconds counted, the loners weigh 15 each: 200 against 50 + 30 + 6 x 15 = 170.
    assert sorted(partition(groups(manifest, list(manifest.artifacts)), costs, 2, verify=True)[0]) == sorted(shards[0])


def test_an_artifact_without_history_counts_as_the_mean(manifest) -> None:
    costs = seconds(tower_224=100, tower_96_fp32=10)  # mean 55 for the ten others
    shards = partition(groups(manifest, ["tower_224", "tower_96_fp32", "tower_96_fp16"]), costs, 2, verify=False)
    assert shards == [["tower_224"], ["tower_96_fp16", "tower_96_fp32"]]


def costly_lock(project, **seconds: float) -> str:
    lock = {name: {"cost": {"build_seconds": seconds.get(name, 5.0), "verify_seconds": seconds.get(name, 5.0) / 5,
                            "peak_rss_bytes": 1 << 30}}
            for name in project.manifest.artifacts}
    return render_lock(lock)


def test_select_shard_reads_costs_from_the_committed_lock_file(tmp_path: Path) -> None:
    project_dir = ProjectDir(tmp_path)
    project_dir.manifest(MANIFEST)
    project = project_dir.project()
    (tmp_path / "artifacts.lock").write_text(costly_lock(project, tower_224=500.0))
    # Not committed (not even in a git work tree): no costs, balanced by count.
    _, basis = select_shard(project, list(project.manifest.artifacts), 1, 2, verify=True)
    assert basis.startswith("artifacts.lock is not committed: no recorded costs: balanced by artifact count")
    commit(tmp_path, "artifacts.lock")
    shard, basis = select_shard(project, list(project.manifest.artifacts), 1, 2, verify=True)
    assert shard.artifacts == ("tower_224",)
    assert basis == "balanced by recorded seconds (12 of 12 artifacts have history); this shard 600s of 666s"
    # Building only, the verification seconds do not count.
    _, basis = select_shard(project, list(project.manifest.artifacts), 1, 2, verify=False)
    assert basis.endswith("this shard 500s of 555s")
    other, _ = select_shard(project, list(project.manifest.artifacts), 2, 2, verify=True)
    assert len(other.artifacts) == 11 and "tower_qnn" in other.artifacts
    # The order within a shard puts sources first.
    assert other.artifacts.index("tower_64_fp32") < other.artifacts.index("tower_qdq") < other.artifacts.index("tower_qnn")


def test_the_partition_ignores_what_a_run_in_this_checkout_wrote(tmp_path: Path) -> None:
    """A first shard run rewrites the lock file (and leaves build records): a second
    shard run in the same checkout must still deal the same partition, or one artifact
    lands in both shards and another in neither."""
    project_dir = ProjectDir(tmp_path)
    project_dir.manifest(MANIFEST)
    project = project_dir.project()
    (tmp_path / "artifacts.lock").write_text(costly_lock(project, tower_224=500.0))
    commit(tmp_path, "artifacts.yaml", "artifacts.lock")
    everyone = list(project.manifest.artifacts)
    before = [select_shard(project, everyone, index, 2, verify=False)[0].artifacts for index in (1, 2)]
    # The first shard's run: another cost in the lock file, and a local build record.
    (tmp_path / "artifacts.lock").write_text(costly_lock(project, tower_224=1.0, siglip_a=900.0))
    pretend_built(project, "tower_96_fp32")
    first = select_shard(project_dir.project(), everyone, 1, 2, verify=False)[0].artifacts
    second = select_shard(project_dir.project(), everyone, 2, 2, verify=False)[0].artifacts
    assert [first, second] == before
    assert sorted(first + second) == sorted(everyone)


def test_bad_shard_on_the_command_line_is_one_line(project_dir: ProjectDir) -> None:
    project_dir.manifest(TOWER_MANIFEST)
    result = project_dir.doit("build", "--shard", "3/2")
    assert result.returncode == 3
    assert "--shard: expected 1 <= I <= N, found 3/2" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_empty_shard_runs_nothing(project_dir: ProjectDir) -> None:
    project_dir.manifest(TOWER_MANIFEST)
    result = project_dir.doit("build", "--shard", "2/2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "shard 2/2: 0 artifacts (none); artifacts.lock is not committed: no recorded costs" in result.stderr
    assert not (project_dir.root / "build").exists()


# --- sharded builds, then the gather step, through the real CLI ----------------------


TWO_TOWERS = TOWER_MANIFEST + "  u:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 96\n"


@pytest.mark.slow
def test_two_shards_then_a_gather_that_exports_nothing(verified_seed: Path, tmp_path: Path, keys: dict[str, Path]) -> None:
    remote = tmp_path / "remote"
    remote.mkdir()
    # The shards sign what they push with the team's key; the gather trusts it.
    env = signing_env(keys, str(remote))
    shard_of: dict[str, str] = {}
    for index in (1, 2):
        # Each shard on a runner of its own (the seed has built and verified `t`: its runner
        # only pushes it).
        runner = clone_project(verified_seed, tmp_path / f"shard{index}")
        runner.manifest(TWO_TOWERS)
        result = runner.doit("verify", "--shard", f"{index}/2", env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        (name,) = re.search(rf"shard {index}/2: 1 artifacts \((\w+)\); ", result.stderr).groups()
        shard_of[name] = result.stderr
    assert sorted(shard_of) == ["t", "u"]
    assert "[u] built in" in shard_of["u"] and "[t] built in" not in shard_of["t"]

    gather = fresh_clone(verified_seed, tmp_path / "gather")
    gather.manifest(TWO_TOWERS)
    result = gather.doit("verify", "--pull-only", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("t", "u"):
        assert f"[{name}] pulled from the remote cache {remote} in " in result.stderr
        # Pulled with its passing report, signed (into the store too): nothing left to judge or keep.
        assert f"-- verify:{name}\n" in result.stdout
    assert "built in" not in result.stderr and "# t (qwen3_5_vision_tower)" not in result.stderr
    lock = json.loads((gather.root / "artifacts.lock").read_text())["artifacts"]
    assert lock["t"]["verified"] is True and lock["u"]["verified"] is True
    # The costs travelled with the records: the next sharding is balanced by them.
    assert lock["u"]["cost"]["build_seconds"] > 0

    # A gather whose shard never pushed: an error naming the artifact, and no export.
    missing = fresh_clone(verified_seed, tmp_path / "missing")
    missing.manifest(TWO_TOWERS + "  w:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 128\n")
    failed = missing.doit("verify", "--pull-only", env=env)
    assert failed.returncode != 0
    output = failed.stdout + failed.stderr
    assert "w: fingerprint " in output and (
        f"is neither built here, in the store nor in the remote cache ({remote}), and --pull-only exports nothing: "
        "the shard or cluster worker that builds it did not push it (did it run, and pass verification?)"
    ) in output
    assert "Traceback" not in output and not (missing.root / "build" / "w").exists()


@pytest.mark.slow
def test_read_only_remote_pulls_and_never_pushes(verified_seed: Path, tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    remote.mkdir()
    project = clone_project(verified_seed, tmp_path / "pr")
    fingerprint = project.project().artifact("t").fingerprint
    env = {"EDGEBUILD_REMOTE_CACHE": str(remote)}
    # Not verified at this fingerprint yet (no report): it is judged, and would be pushed.
    (project.root / "build" / "t" / "report.json").unlink()
    first = project.doit("verify", "--remote-readonly", env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"[t] remote cache: read-only, {fingerprint[:12]} not pushed to {remote}" in first.stderr
    assert not RemoteCache.open(str(remote)).has_entry(fingerprint)
    # A read-only remote is not waited for: the next run is up to date, not another attempt to push.
    again = project.doit("verify", env=env | {"EDGEBUILD_REMOTE_CACHE_READONLY": "1"})
    assert again.returncode == 0 and "-- verify:t" in again.stdout, again.stdout + again.stderr
    # The same checkout with a writable remote pushes.
    pushed = project.doit("verify", env=env)
    assert f"[t] remote cache: pushed {fingerprint[:12]} to {remote}" in pushed.stderr


def test_the_workflow_runs_a_matrix_of_shards_then_the_gather() -> None:
    import yaml

    from helpers import REPO

    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())
    shards = int(workflow["env"]["SHARDS"])
    shard_job = workflow["jobs"]["shard"]
    assert shard_job["strategy"]["matrix"]["shard"] == list(range(1, shards + 1))
    runs = "\n".join(step.get("run", "") for step in shard_job["steps"])
    assert "scripts/ci_steps.sh --skip-tests --shard ${{ matrix.shard }}/$SHARDS" in runs
    # Pull requests read the shared cache and never write to it.
    assert 'if [ "$TRUSTED_BUILD" != true ]; then echo "EDGEBUILD_REMOTE_CACHE_READONLY=1"' in runs
    assert workflow["env"]["TRUSTED_BUILD"] == "${{ github.event_name == 'push' && github.ref == 'refs/heads/main' }}"
    gather = workflow["jobs"]["gather"]
    assert gather["needs"] == ["tests", "shard"]
    assert "scripts/ci_steps.sh --skip-tests --gather" in "\n".join(step.get("run", "") for step in gather["steps"])
    ci_run = (REPO / ".ci" / "run").read_text()
    assert 'for shard in 1/2 2/2; do' in ci_run and "--gather" in ci_run
