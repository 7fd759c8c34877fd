"""Every file edgebuild reads back is read bounded: a regular file only, at most so many
bytes, JSON of bounded nesting. A device, a FIFO, a directory or a huge file where a
manifest, lock file, record, report or cache belongs is one line naming the file, in
bounded time and memory, and nothing is written."""

from __future__ import annotations

import json
import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from edgebuild.core.files import MAX_JSON_DEPTH, UnreadableFile, parse_json, read_bytes, read_json
from edgebuild.core.report import read_report
from edgebuild.core.statcache import StatCache
from edgebuild.errors import LockfileError, RecordError
from edgebuild.core.lock_format import read_lock
from edgebuild.core.record import read_record
from edgebuild.core.config import without_settings

from helpers import TOWER_MANIFEST, ProjectDir, pretend_built

# A command that reads a hostile file must stay far below this (the /dev/zero manifest
# grew to 23.9 GB before the kernel killed it).
ADDRESS_SPACE_LIMIT = 2 << 30
SECONDS = 60


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))


def doit(project_dir: ProjectDir, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``doit args`` bounded in memory and time: a read that is not bounded fails the test
    instead of taking the machine down."""
    environment = without_settings(os.environ) | (env or {})
    return subprocess.run([str(Path(sys.executable).with_name("doit")), *args], cwd=project_dir.root, env=environment,
                          capture_output=True, text=True, timeout=SECONDS, preexec_fn=limited)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# --- the reader ------------------------------------------------------------------------


def test_read_bytes_refuses_what_is_not_a_regular_file_or_too_large(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 1001)
    for path, message in [(Path("/dev/zero"), "a character device, not a regular file"),
                          (fifo, "a FIFO (named pipe), not a regular file"),
                          (tmp_path, "a directory, not a regular file"),
                          (big, "1001 B, more than the 1000 B a file of this kind may hold")]:
        with pytest.raises(UnreadableFile) as caught:
            read_bytes(path, 1000)
        assert str(caught.value) == message
    assert read_bytes(big, 1001) == b"x" * 1001
    with pytest.raises(FileNotFoundError):
        read_bytes(tmp_path / "absent", 10)


def test_json_nesting_is_bounded(tmp_path: Path) -> None:
    assert parse_json("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None
    with pytest.raises(UnreadableFile) as caught:
        parse_json("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    assert str(caught.value) == f"JSON nested more than {MAX_JSON_DEPTH} levels deep"
    # Deeper than the parser's own recursion: the same kind of error, not a RecursionError.
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000)
    with pytest.raises(UnreadableFile) as caught:
        read_json(path, 1 << 20)
    assert str(caught.value) == "not valid JSON: nested too deeply"
    with pytest.raises(UnreadableFile) as caught:
        parse_json(b"\xff")
    assert str(caught.value).startswith("not valid JSON")


def test_each_state_file_reader_bounds_what_it_reads(tmp_path: Path) -> None:
    (tmp_path / "artifacts.lock").mkdir()
    with pytest.raises(LockfileError) as caught:
        read_lock(tmp_path / "artifacts.lock")
    assert "artifacts.lock: a directory, not a regular file; expected a JSON lock file" in str(caught.value)

    record_dir = tmp_path / "build" / "t"
    record_dir.mkdir(parents=True)
    os.mkfifo(record_dir / ".edgebuild.json")
    with pytest.raises(RecordError) as caught:
        read_record(record_dir)
    assert str(caught.value).endswith(".edgebuild.json: not a build record (a FIFO (named pipe), not a regular file)")

    report_dir = tmp_path / "report"
    report_dir.mkdir()
    (report_dir / "report.json").write_text("[" * 200_000)
    assert read_report(report_dir) is None  # unreadable: not verified
    deep: list = []
    for _ in range(MAX_JSON_DEPTH + 5):
        deep = [deep]
    (report_dir / "report.json").write_text(json.dumps({"format": 1, "deep": deep}))
    assert read_report(report_dir) is None

    # A cache: the earlier version's JSON file, unreadable, is deleted; its files are hashed again.
    cache = tmp_path / "cache" / "statcache.sqlite"
    cache.parent.mkdir()
    (cache.parent / "statcache.json").write_text("[" * 200_000)
    stat_cache = StatCache(cache)
    stat_cache.file_digest(report_dir / "report.json")
    assert stat_cache.bytes_hashed == (report_dir / "report.json").stat().st_size
    assert not (cache.parent / "statcache.json").exists()
    # A FIFO in its place: never waited on; gone on without (said in one line), nothing saved.
    fifo = tmp_path / "fifo" / "statcache.sqlite"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    in_fifo = StatCache(fifo)
    in_fifo.file_digest(report_dir / "report.json")
    assert in_fifo.bytes_hashed == (report_dir / "report.json").stat().st_size
    in_fifo.save()
    assert in_fifo.unusable == "a FIFO (named pipe), not a regular file"
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


# --- through the commands --------------------------------------------------------------


@pytest.mark.parametrize("manifest, found", [
    ("/dev/zero", "a character device, not a regular file"),
    ("/dev/urandom", "a character device, not a regular file"),
    ("fifo.yaml", "a FIFO (named pipe), not a regular file"),
    ("folder.yaml", "a directory, not a regular file"),
])
@pytest.mark.parametrize("command", ["list", "check", "status"])
def test_a_manifest_that_is_not_a_file_is_one_line(project_dir: ProjectDir, manifest: str, found: str,
                                                   command: str) -> None:
    os.mkfifo(project_dir.root / "fifo.yaml")
    (project_dir.root / "folder.yaml").mkdir()
    line = one_line(doit(project_dir, command, env={"EDGEBUILD_MANIFEST": manifest}))
    shown = manifest if manifest.startswith("/") else str(project_dir.root / manifest)
    assert line == f"edgebuild: error: {shown}: cannot read manifest: {found}; expected a YAML file"
    assert sorted(path.name for path in project_dir.root.iterdir()) == ["dodo.py", "fifo.yaml", "folder.yaml"]


@pytest.mark.parametrize("variable", ["EDGEBUILD_TRUSTED_KEYS", "EDGEBUILD_SIGNING_KEY"])
@pytest.mark.parametrize("target", ["/dev/zero", "keys.fifo"])
def test_a_key_that_is_not_a_file_is_one_line_at_once(project_dir: ProjectDir, variable: str, target: str) -> None:
    """A FIFO named as a key was waited on forever; /dev/zero read without end."""
    project_dir.manifest(TOWER_MANIFEST)
    os.mkfifo(project_dir.root / "keys.fifo")
    before = sorted(project_dir.root.rglob("*"))
    line = one_line(doit(project_dir, "status", env={variable: target}))
    shown = target if target.startswith("/") else str(project_dir.root / target)
    found = "a character device" if target.startswith("/") else "a FIFO (named pipe)"
    assert line == f"ERROR: {variable}: {shown}: {found}, not a regular file; expected a PEM key file"
    assert sorted(project_dir.root.rglob("*")) == before  # nothing written, anywhere in the project


def test_a_manifest_too_large_is_one_line(project_dir: ProjectDir) -> None:
    huge = project_dir.root / "artifacts.yaml"
    with open(huge, "wb") as handle:
        handle.truncate(20 << 20)  # sparse: 20 MiB of zeros, no disk
    line = one_line(doit(project_dir, "list"))
    assert line == ("edgebuild: error: artifacts.yaml: cannot read manifest: 20.0 MiB, more than the 16.0 MiB a file "
                    "of this kind may hold; expected a YAML file")


def test_a_lock_file_that_is_a_directory_is_one_line_before_anything_is_built(project_dir: ProjectDir) -> None:
    project_dir.manifest(TOWER_MANIFEST)
    (project_dir.root / "artifacts.lock").mkdir()
    line = one_line(doit(project_dir, "build", env={"EDGEBUILD_REMOTE_CACHE": "off"}))
    assert line == ("ERROR: artifacts.lock: a directory, not a regular file; expected a JSON lock file "
                    "(delete it and run `doit build` to write it afresh)")
    assert not (project_dir.root / "build").exists()


def test_a_report_nested_too_deeply_is_not_verified_not_a_traceback(project_dir: ProjectDir) -> None:
    project_dir.manifest(TOWER_MANIFEST)
    output = project_dir.root / "build" / "t" / "model.onnx"
    output.parent.mkdir(parents=True)
    output.write_bytes(b"graph")
    from edgebuild.core.hashing import file_digest

    pretend_built(project_dir.project(), "t", {"model.onnx": file_digest(output)})
    (output.parent / "report.json").write_text("[" * 200_000)
    (output.parent / "report.md").write_text("# t\n")
    result = doit(project_dir, "report")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    status = doit(project_dir, "status")
    assert status.stdout == "t  up to date (not verified)\n", status.stdout + status.stderr


# --- every read goes through the bounded reader ------------------------------------------

# The only places in the package that open a file or call ``read_text``/``read_bytes``
# themselves, each with why it may. Everything else edgebuild reads -- keys, configs,
# reports, records, entries, lock files, indexes, checkpoints, inputs, blobs -- goes
# through ``edgebuild/core/files.py`` (bounded, regular files only, never waiting on a
# FIFO). A new raw read fails the test below until it is routed there or listed here.
RAW_READS_ALLOWED = {
    "edgebuild/core/files.py:read_bytes": "the bounded reader itself",
    "edgebuild/core/files.py:_open_checked": "the regular-file opener itself (O_NONBLOCK, fstat)",
    "edgebuild/cache/copying.py:copy_file": "copies a build's outputs (regular files: the link rule) or store blobs",
    "edgebuild/cache/copying.py:_direct_copy": "opens the copy it writes",
    "edgebuild/cache/signing.py:generate": "creates the new key pair (O_EXCL)",
    "edgebuild/cli/scaffold.py:_append_ignores": "appends to a .gitignore read as a regular file, not a link, just before",
    "edgebuild/cli/scaffold.py:_create": "creates new files (exclusive)",
    "edgebuild/core/fingerprint.py:_parsed": "a kind's source code, or edgebuild's own",
    "edgebuild/core/fingerprint.py:code_digests": "a kind's source code",
    "edgebuild/core/fixtures.py:fixture_directory": "the source code of a fixture's generator",
    "edgebuild/core/hashing.py:written_file_digest": "a file this process just wrote into its own scratch directory",
    "edgebuild/models/hf_fixtures.py:_save_processor": "a fixture file just written",
    "edgebuild/models/qwen3_5/fixtures.py:_write_qwen3_5_vl_fp8": "fixture files just written",
    "edgebuild/ml/onnx_tools.py:provider_placement": "the profile onnxruntime just wrote",
    "edgebuild/ml/mapped_safetensors.py:MappedSafetensors.create": "creates the file it writes",
    "edgebuild/targets/program.py:_zero_serialization_id": "the program torch.export.save just wrote",
    "edgebuild/cli/ci_template.py:_as_installed": "an installed distribution's direct_url.json, through importlib.metadata",
    "edgebuild/kinds/siglip_f143/packed.py:sort_metadata": "the file the build just wrote",
    "edgebuild/run/release.py:sign_entry": "the signature model-signing just wrote into a scratch directory",
    "edgebuild/run/forkserver.py:_shared_key": "/proc/self/cgroup, the kernel's",
    "edgebuild/run/forkserver.py:_umask": "/proc/self/status, the kernel's",
    "edgebuild/core/console.py:reader_gone": "opens /dev/null for writing: stdout once its reader went away",
    "edgebuild/kinds/executorch/build.py:build": "creates the .pte it writes, in its scratch directory",
    # A checkpoint file a kind reads: Checkpoint.file (or the kind) found a regular file,
    # and the fingerprint hashed it (through open_regular) before the build runs.
    "edgebuild/models/hf.py:image_processor": "a checkpoint file, a regular file hashed by the fingerprint first",
    "edgebuild/models/qwen3_5/images.py:read_preprocessor_config": "a checkpoint file, as above",
    "edgebuild/ml/images.py:load_rgb_image": "an input image: expand_inputs refused anything but a regular file",
    # A kind reads its own outputs or its source's: regular files of a build directory
    # (the link rule), checked at their recorded digests before a verification or a build.
    "edgebuild/kinds/hf_onnx/verify.py:verify": "its own output",
    "edgebuild/kinds/qnn_context/verify.py:verify": "its own output",
    "edgebuild/kinds/qwen3_5_tower_qdq/build.py:build": "its source's output",
    "edgebuild/kinds/qwen3_5_tower_qdq/verify.py:evaluation_inputs": "its source's output",
    "edgebuild/kinds/siglip_f143/verify.py:runner": "its own outputs",
    "edgebuild/kinds/siglip_f143/verify.py:image_feeds": "its own output",
    "edgebuild/kinds/siglip_f143_onnx/verify.py:evaluation_inputs": "its own output",
    "edgebuild/kinds/siglip_f143_onnx/verify.py:image_feeds": "its own output",
    "edgebuild/kinds/siglip_f143/verify.py:verify": "its own outputs",
    "edgebuild/kinds/siglip_f143_onnx/build.py:build": "its source's output",
    "edgebuild/kinds/siglip_f143_onnx/model.py:load_quantized": "its source's outputs",
    "edgebuild/kinds/siglip_f143_onnx/verify.py:verify": "its own output",
}


def raw_reads(package: Path) -> set[str]:
    """``file:function`` of every call of ``open``, ``os.open``, ``io.open``, or a
    ``read_text``/``read_bytes`` method (pathlib's) in ``package``."""
    import ast

    found: set[str] = set()
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package.parent).as_posix()

        def visit(node: ast.AST, where: str) -> None:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                where = f"{where}.{node.name}" if where else node.name
            if isinstance(node, ast.Call):
                call = node.func
                if ((isinstance(call, ast.Name) and call.id == "open")
                        or (isinstance(call, ast.Attribute) and call.attr == "open"
                            and isinstance(call.value, ast.Name) and call.value.id in ("os", "io"))
                        or (isinstance(call, ast.Attribute) and call.attr in ("read_text", "read_bytes"))):
                    found.add(f"{relative}:{where or '<module>'}")
            for child in ast.iter_child_nodes(node):
                visit(child, where)

        visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


def test_every_read_goes_through_the_bounded_reader_but_the_listed_exceptions() -> None:
    import edgebuild

    found = raw_reads(Path(edgebuild.__file__).parent)
    assert sorted(found - set(RAW_READS_ALLOWED)) == [], "route these reads through edgebuild/core/files.py"
    # An exception that is gone is dropped from the list too: the list says what is true.
    assert sorted(set(RAW_READS_ALLOWED) - found) == []


def test_the_raw_read_scan_finds_each_form(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text(
        "import os\nfrom pathlib import Path\n\n\ndef a(p):\n    return open(p).read()\n\n\n"
        "class K:\n    def b(self, p):\n        return os.open(p, 0)\n\n\n"
        "def c(p):\n    return Path(p).read_text() + Path(p).read_bytes().decode()\n\n\n"
        "def d(p, read_text):\n    return read_text(p, 10)\n"
    )
    assert raw_reads(package) == {"pkg/m.py:a", "pkg/m.py:K.b", "pkg/m.py:c"}


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_an_input_file_or_checkpoint_shard_that_is_a_fifo_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    """Streams no cap fits (checkpoints, inputs, blobs, outputs) are opened by
    ``open_regular``: a FIFO or directory is an OSError at once, never waited on."""
    from edgebuild.core.files import IrregularFile, open_lock, open_regular
    from edgebuild.core.hashing import file_digest

    path = tmp_path / "x"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    found = "a FIFO (named pipe), not a regular file" if kind == "fifo" else "a directory, not a regular file"
    for reader in (open_regular, file_digest, open_lock) if kind == "fifo" else (open_regular, file_digest):
        with pytest.raises(IrregularFile) as caught:
            reader(path)
        assert (str(caught.value), caught.value.filename, isinstance(caught.value, OSError)) == (found, str(path), True)
    if kind == "directory":
        with pytest.raises(IsADirectoryError):
            open_lock(path)
