"""Rough edges, round 5 (issue 60), the parts done this round: the signing key out of pull
requests' reach (tests/test_scaffold.py), CI requirements that follow the manifest, a diff
that reads relaxed gates as that (tests/test_diff.py), ids cast as LiteRT declares them
(tests/test_litert.py), and one line, not a traceback, for each input below."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy
import pytest

from edgebuild.core.config import Settings
from edgebuild.core.manifest import load_manifest
from edgebuild.errors import ConfigError, ManifestError

from helpers import CLIP_TO_QDQ, lay_out_project

BUILTIN_GATE = CLIP_TO_QDQ.replace("    outputs: [pooler_output]\n", "    outputs: [pooler_output]\n"
                                   "    verify:\n      dataset: {builtin: skimage, min_cosine: 0.9}\n", 1)


def _edgebuild(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgebuild", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_ci_requirements_follow_what_the_manifest_needs(tmp_path: Path) -> None:
    """`init --ci` left out the extra a built-in dataset gate needs: `check --deep --ci`
    passed, then every shard failed. The file names it now, `check --ci` refuses one
    without it, and `init --ci ... --refresh-requirements` writes it again."""
    (tmp_path / "artifacts.yaml").write_text(BUILTIN_GATE)
    (tmp_path / "ci").mkdir()
    (tmp_path / "ci" / "requirements.txt").write_text("# written before the gate\nedgebuild[sign]==0.1\n")
    checked = _edgebuild("check", "--ci", cwd=tmp_path)
    assert checked.returncode == 2
    (line,) = checked.stderr.splitlines()
    assert line == (f"edgebuild: error: {tmp_path / 'ci' / 'requirements.txt'}: edgebuild is installed without the "
                    "extra 'datasets', which artifacts -> clip -> verify -> dataset (builtin: skimage) needs on a "
                    "runner; add it (edgebuild[...,datasets]), or write the file again from the manifest: python -m "
                    "edgebuild init --ci github --refresh-requirements")
    refreshed = _edgebuild("init", "--ci", "script", "--refresh-requirements", "--requirement", "edgebuild==0.1",
                           cwd=tmp_path)
    assert refreshed.returncode == 0, refreshed.stderr
    assert "edgebuild[datasets,sign]==0.1" in (tmp_path / "ci" / "requirements.txt").read_text().splitlines()
    assert (tmp_path / "artifacts.yaml").read_text() == BUILTIN_GATE
    assert _edgebuild("check", "--ci", cwd=tmp_path).returncode == 0
    refused = _edgebuild("init", "--refresh-requirements", cwd=tmp_path)
    assert refused.returncode != 0 and "--refresh-requirements: writes ci/requirements.txt again; give it with --ci" \
        in refused.stderr


def test_check_deep_refuses_a_dataset_glob_that_matches_nothing(tmp_path: Path) -> None:
    manifest = BUILTIN_GATE.replace("{builtin: skimage, min_cosine: 0.9}", "{images: [photos/*.jpg], min_cosine: 0.9}")
    lay_out_project(tmp_path, manifest)
    checked = _edgebuild("check", "--deep", cwd=tmp_path)
    assert checked.returncode == 2
    assert checked.stderr.strip().endswith("artifacts -> clip -> verify -> dataset.images: 'photos/*.jpg' matches no "
                                           f"file (relative to {tmp_path})")


@pytest.mark.parametrize("value", [" ", "cache\ndir", "\t"])
def test_a_blank_remote_cache_setting_is_one_line(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_environ({"EDGEBUILD_REMOTE_CACHE": value})
    assert str(caught.value).startswith("EDGEBUILD_REMOTE_CACHE: expected a directory or a URL (or 'off'), found ")


def test_a_group_writable_trusted_key_is_refused_as_ssh_refuses_it(tmp_path: Path) -> None:
    from edgebuild.cache.signing import generate, load_public_key

    _, public = generate(tmp_path / "team")
    os.chmod(public, 0o664)
    with pytest.raises(ConfigError, match=r"mode 0664 lets others than its owner rewrite a trusted key.*chmod go-w"):
        load_public_key(public)
    os.chmod(public, 0o644)
    assert load_public_key(public) is not None


def test_a_negative_seed_is_refused_at_load(tmp_path: Path) -> None:
    (tmp_path / "artifacts.yaml").write_text(BUILTIN_GATE.replace("min_cosine: 0.9}", "min_cosine: 0.9, seed: -1}"))
    with pytest.raises(ManifestError) as caught:
        load_manifest(tmp_path / "artifacts.yaml")
    assert "dataset -> seed" in str(caught.value) and "\n" not in str(caught.value)


def test_the_bootstrap_draws_in_bounded_memory_the_same_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    from edgebuild.ml import statistics

    values = {"a": numpy.linspace(0.9, 1.0, 37), "b": numpy.linspace(0.5, 1.0, 37) ** 2}
    at_once = statistics.bootstrap(values, resamples=500, seed=4)
    monkeypatch.setattr(statistics, "BOOTSTRAP_ELEMENTS", 37 * 7)
    assert statistics.bootstrap(values, resamples=500, seed=4) == at_once


def test_the_stat_cache_is_never_written_through_a_link(tmp_path: Path) -> None:
    from edgebuild.core.statcache import StatCache

    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "cache").mkdir()
    link = tmp_path / "cache" / "statcache.sqlite"
    link.symlink_to(outside / "db.sqlite")
    cache = StatCache(link)
    data = tmp_path / "data.bin"
    data.write_bytes(b"x" * 10)
    cache.file_digest(data)
    cache.save()
    # Gone on without (tests/test_cache_without_cache.py: what the command says).
    assert cache.unusable is not None and "never written through a link" in cache.unusable
    assert list(outside.iterdir()) == []


def test_a_kind_that_cannot_run_the_artifact_fails_its_report_in_one_line() -> None:
    from edgebuild.core.kind import Verification
    from edgebuild.errors import NotRunnable
    from edgebuild.run.verification import _ran

    def refused() -> Verification:
        raise NotRunnable("input input_ids: the converted model declares int32, and the input is float32")

    (failed,) = _ran(refused, "the litert kind's checks", lambda check: Verification(checks=[check])).checks
    assert (failed.name, failed.passed) == ("verify.ran", False)
    assert failed.detail == ("the litert kind's checks could not run here: input input_ids: the converted model "
                             "declares int32, and the input is float32")


@pytest.mark.parametrize("arguments, said", [
    (("build", "-n", "99999999999"), "-n/--process: expected a number of processes from 0 to 1024, found '99999999999'"),
    (("verify", "--fail-fast", "--continue"),
     "--fail-fast stops at the first failure and --continue goes on after it: give one"),
])
def test_contradictory_or_absurd_options_are_one_line(tmp_path: Path, arguments: tuple[str, ...], said: str) -> None:
    project = lay_out_project(tmp_path, CLIP_TO_QDQ)
    result = project.doit(*arguments)
    assert result.returncode != 0 and "Traceback" not in result.stdout + result.stderr
    assert said in result.stdout + result.stderr
    assert not (tmp_path / "build").exists()


def test_check_deep_names_an_input_the_model_does_not_take(tmp_path: Path) -> None:
    """A target's input-name typo passed `check --deep` and ended in transformers' traceback
    at the build."""
    (tmp_path / "artifacts.yaml").write_text("""\
checkpoints:
  clip: {fixture: clip_vision_tiny}
artifacts:
  clip_et:
    kind: executorch
    checkpoint: clip
    model_class: CLIPVisionModel
    inputs: {pixelvalues: [1, 3, 64, 64]}
    outputs: [pooler_output]
  clip_onnx:
    kind: hf_onnx
    checkpoint: clip
    model_class: CLIPVisionModel
    inputs: {pixel_value: [1, 3, 64, 64]}
    outputs: [pooler_output]
""")
    checked = _edgebuild("check", "--deep", cwd=tmp_path)
    assert checked.returncode == 2 and "Traceback" not in checked.stderr
    errors = [line for line in checked.stderr.splitlines() if line.startswith("edgebuild: error:")]
    assert errors == [
        "edgebuild: error: artifacts.yaml:8:5: artifacts -> clip_et.torch_export -> inputs: 'pixelvalues' is not an "
        "input of CLIPVisionModel.forward (did you mean 'pixel_values'?); it takes pixel_values, interpolate_pos_encoding",
        "edgebuild: error: artifacts.yaml:14:5: artifacts -> clip_onnx -> inputs: 'pixel_value' is not an input of "
        "CLIPVisionModel.forward (did you mean 'pixel_values'?); it takes pixel_values, interpolate_pos_encoding",
    ], checked.stderr


@pytest.mark.slow
def test_ctrl_c_during_a_command_is_one_line_and_keeps_what_finished(tmp_path: Path) -> None:
    """Ctrl-C in a terminal reaches the doit process too, not only its worker: it ended in
    a KeyboardInterrupt traceback (issue 60)."""
    import signal
    import time

    project = lay_out_project(tmp_path, CLIP_TO_QDQ)
    environment = os.environ | {"EDGEBUILD_REMOTE_CACHE": "off", "EDGEBUILD_FAULT": "build.before_rename=stall",
                                "EDGEBUILD_FAULT_STALL_SECONDS": "120"}
    process = subprocess.Popen([str(Path(sys.executable).with_name("doit")), "verify"], cwd=tmp_path, env=environment,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        said = ""
        while "stall" not in said and time.monotonic() < deadline and process.poll() is None:
            said += process.stderr.readline()
        assert "stall" in said, said
        # As a terminal's Ctrl-C: SIGINT to the command's whole process group.
        os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, stdout + stderr
    assert "Traceback" not in stdout + stderr and "KeyboardInterrupt" not in stdout + stderr
    assert "edgebuild: error: interrupted (Ctrl-C): the verification in progress was stopped and counts for nothing" \
        in stderr
    assert not (tmp_path / "build" / "clip").exists()

