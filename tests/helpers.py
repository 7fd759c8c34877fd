"""Helpers the tests share (fixtures live in ``conftest.py``): project directories
laid out as a user's, the one-tower manifest, copies of a built project."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from edgebuild.testing import TinyProject
    import pytest

REPO = Path(__file__).resolve().parent.parent

# A tiny CLIP encoder exported, then quantized A16W8 on images/ and held_out/ (the
# tests lay those out): the shortest chain with a float source.
CLIP_TO_QDQ = """\
checkpoints:
  clip:
    fixture: clip_vision_tiny
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


# The generated checkpoints of every fixture at its default config, made once for the run
# on first use (conftest.py sets this to the function that makes or finds them). A project
# the tests lay out starts with copies of those its manifest names, as a project that has
# run before has them: otherwise the first doit process of every test imports transformers
# to write them again (8 s of a tower's 34 s build from nothing on 2 cores). Writing them is
# tested where it is the subject (test_fixtures.py, and every manifest that changes a
# fixture's config).
generated_checkpoints: "Callable[[], Path] | None" = None


def with_generated_checkpoints(root: Path, manifest: str) -> None:
    """Copy into ``root/cache/fixtures`` the run's generated checkpoints of the fixtures
    ``manifest`` names (each a copy: a test may change its files)."""
    import re

    named = set(re.findall(r"\bfixture:\s*([A-Za-z0-9_]+)", manifest))
    if generated_checkpoints is None or not named:
        return
    for made in generated_checkpoints().iterdir():
        target = root / "cache" / "fixtures" / made.name
        if made.name.rsplit("-", 1)[0] in named and not target.exists():
            shutil.copytree(made, target)


class ProjectDir:
    """A project directory laid out as a user's: dodo.py and a manifest (the commands
    come from the installed package's entry points), with the generated checkpoints the
    manifest names (:func:`with_generated_checkpoints`)."""

    def __init__(self, root: Path, lay_out: bool = True) -> None:
        self.root = root
        if not lay_out:
            return
        shutil.copy(REPO / "dodo.py", root / "dodo.py")

    @classmethod
    def existing(cls, root: Path) -> "ProjectDir":
        """A project directory that is already laid out (a copy of another)."""
        return cls(root, lay_out=False)

    def manifest(self, text: str, name: str = "artifacts.yaml") -> Path:
        path = self.root / name
        path.write_text(textwrap.dedent(text))
        with_generated_checkpoints(self.root, text)
        return path

    def doit(self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        require_installed_commands()
        environment = {
            key: value for key, value in os.environ.items() if key not in ("EDGEBUILD_MANIFEST", "EDGEBUILD_VERBOSE")
        }
        environment.update(env or {})
        doit = Path(sys.executable).with_name("doit")
        return subprocess.run(
            [str(doit), *args], cwd=cwd or self.root, env=environment, capture_output=True, text=True, timeout=600
        )

    def project(self):
        """The workspace, as a new process opens it (nothing memoised)."""
        from edgebuild.run.workspace import Workspace

        return Workspace.open(self.root / "artifacts.yaml", self.root)


EDGEBUILD_COMMANDS = ("build", "cache", "clean", "diff", "divergence", "gc", "publish", "report", "status", "verify")


def require_installed_commands() -> None:
    """The doit commands are entry points of the installed package: an install made
    before they were (or of another package) does not have them, and every CLI test
    would fail with doit's "Invalid parameter" instead of saying why."""
    import pytest
    from importlib.metadata import entry_points

    found = {point.name: point.value for point in entry_points(group="doit.COMMAND")}
    missing = [name for name in EDGEBUILD_COMMANDS if not found.get(name, "").startswith("edgebuild.cli.")]
    if missing:
        pytest.fail(
            f"doit command(s) {', '.join(missing)} are not installed as entry points (group doit.COMMAND): "
            "reinstall the package (pip install -e '.[test]') so that its entry points are registered",
            pytrace=False,
        )


# --- what the test set-up installs -------------------------------------------------------

# .ci/run and scripts/ci_steps.sh set it to 1: a test skipped for want of something the test
# set-up installs fails instead (conftest.py), so a set-up that lost a dependency cannot
# pass as a green run of tests that never ran. Elsewhere -- a developer's machine without
# Chromium -- such a test skips, saying so.
REQUIRE_ALL_TESTS = "EDGEBUILD_REQUIRE_ALL_TESTS"
# How the reason of such a skip begins (conftest.py turns it into a failure).
NOT_INSTALLED = "missing, though the test set-up installs it: "


def chromium() -> str | None:
    """The headless browser the page and site tests render in: ``EDGEBUILD_TEST_CHROMIUM``
    (a path, to pick one or to check that its absence is said), else the first of
    chromium, chromium-browser and google-chrome on PATH."""
    chosen = os.environ.get("EDGEBUILD_TEST_CHROMIUM")
    if chosen is not None:
        return chosen if os.access(chosen, os.X_OK) else None
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _chromium_missing() -> str | None:
    if chromium() is not None:
        return None
    chosen = os.environ.get("EDGEBUILD_TEST_CHROMIUM")
    if chosen is not None:
        return f"EDGEBUILD_TEST_CHROMIUM={chosen} is not an executable"
    return "Chromium is not on PATH (Debian: apt-get install chromium)"


def _module_missing(module: str) -> str | None:
    import importlib.util

    return None if importlib.util.find_spec(module) is not None else f"the module {module} is not installed"


def _qnn_missing() -> str | None:
    from edgebuild.kinds.qnn_context.qnn import qnn_unavailable_reason

    return qnn_unavailable_reason()


# Each dependency: why it is missing here (``None``: it is not), and what installs it -- a
# distribution of pyproject's ``test`` extra, or ``None`` for Chromium, which .ci/run
# installs with apt (and GitHub's runners ship).
DEPENDENCIES: dict[str, tuple[Callable[[], str | None], str | None]] = {
    "chromium": (_chromium_missing, None),
    "qnn": (_qnn_missing, "onnxruntime-qnn"),
    "distributed": (lambda: _module_missing("distributed"), "dask"),
    "openvino": (lambda: _module_missing("openvino"), "openvino"),
    "executorch": (lambda: _module_missing("executorch"), "executorch"),
}


def missing(dependency: str) -> str | None:
    """Why ``dependency`` (a key of :data:`DEPENDENCIES`) cannot be used here, as a skip's
    reason; ``None`` when it can. The reason begins with :data:`NOT_INSTALLED` where the
    test set-up installs it on this platform; elsewhere it says the set-up does not."""
    why, installed_by = DEPENDENCIES[dependency]
    reason = why()
    if reason is None:
        return None
    if installed_by is None or _in_the_test_extra_here(installed_by):
        return NOT_INSTALLED + reason
    return f"{reason} (the test set-up does not install {installed_by} on this platform)"


def _in_the_test_extra_here(distribution: str) -> bool:
    """Whether pyproject's ``test`` extra installs ``distribution`` on this platform (its
    environment marker holds here: onnxruntime-qnn has wheels for Linux x86_64 and Windows only)."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    for line in extra:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) == canonicalize_name(distribution):
            return requirement.marker is None or requirement.marker.evaluate()
    raise AssertionError(f"{distribution} is not in pyproject's test extra: DEPENDENCIES names what installs it")


def needs(dependency: str):
    """A mark that skips a test while ``dependency`` is missing (see :func:`missing`)."""
    import pytest

    reason = missing(dependency)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def skip_unless_present(dependency: str) -> None:
    """Skip the rest of a test while ``dependency`` is missing (see :func:`missing`)."""
    import pytest

    reason = missing(dependency)
    if reason is not None:
        pytest.skip(reason)


TOWER_MANIFEST = """\
checkpoints:
  qwen:
    fixture: qwen3_5_vl_tiny
artifacts:
  t:
    kind: qwen3_5_vision_tower
    checkpoint: qwen
    image_size: 64
"""


def git(root: Path, *args: str) -> str:
    """``git args`` in ``root`` with an author set (a fresh machine has none); its stdout."""
    command = ["git", "-c", "user.name=ci", "-c", "user.email=ci@example.invalid", *args]
    return subprocess.run(command, cwd=root, check=True, capture_output=True, text=True, timeout=60).stdout.strip()


def commit(root: Path, *paths: str, message: str = "commit") -> str:
    """Commit ``paths`` in the repository at ``root`` (made on first use); the commit."""
    if not (root / ".git").exists():
        git(root, "init", "-q")
    git(root, "add", *paths)
    git(root, "commit", "-q", "-m", message)
    return git(root, "rev-parse", "HEAD")


def clone_project(seed: Path, target: Path) -> ProjectDir:
    """A copy of ``seed`` (build/, cache/ with its store and doit state, the lock file):
    another checkout that has built and verified what the seed has."""
    shutil.copytree(seed, target, symlinks=True)
    return ProjectDir.existing(target)


def fresh_clone(seed: Path, target: Path) -> ProjectDir:
    """The seed's checkout without anything it built, cached or locked: a new clone, as a
    fresh CI runner or another machine has it."""
    clone = clone_project(seed, target)
    for name in ("build", "cache", "artifacts.lock"):
        path = clone.root / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    return clone


def lay_out_project(root: Path, manifest: str) -> "TinyProject":
    """A user's project at ``root`` with ``manifest`` and the shipped images at ``root/images``
    (calibration) and ``root/held_out``."""
    from edgebuild.testing import TinyProject

    project = TinyProject(root)
    shutil.copytree(REPO / "data" / "calibration", root / "images", dirs_exist_ok=True)
    shutil.copytree(REPO / "data" / "held_out", root / "held_out", dirs_exist_ok=True)
    project.manifest(manifest)
    with_generated_checkpoints(root, manifest)
    return project


def lay_out_siglip_inputs(root: Path, checkpoint: Path) -> Path:
    """A copy of the SigLIP fixture at ``root/ckpt`` and the shipped images at
    ``root/images`` (calibration) and ``root/held_out``."""
    shutil.copytree(checkpoint, root / "ckpt")
    shutil.copytree(REPO / "data" / "calibration", root / "images")
    shutil.copytree(REPO / "data" / "held_out", root / "held_out")
    return root


def kind_fixtures(name: str, _seen: frozenset[str] = frozenset()) -> set[str]:
    """The generated checkpoints an artifact of kind ``name`` can be built from: those its
    kind declares, else those of the kinds whose artifacts its ``source:`` takes (a QDQ
    graph is built from a tower, which is built from a Qwen3.5 fixture). A kind may take
    its own kind's artifacts (a graph converted from a converted graph), so the walk
    remembers where it has been."""
    from edgebuild.core.registry import all_kinds, get_kind

    kind = get_kind(name)
    own = {fixture.name for fixture in kind.fixtures}
    if own:
        return own
    seen = _seen | {name}
    sources = [source for source in all_kinds() if source.name not in seen and kind.takes_source_of(source)]
    return set().union(*(kind_fixtures(source.name, seen) for source in sources))


def build_digest(kind_name: str) -> dict[str, str]:
    """The code digest of a kind's build, as its fingerprint holds it."""
    from edgebuild.core.fingerprint import code_digests, kind_code_packages
    from edgebuild.core.registry import get_kind

    kind = get_kind(kind_name)
    return code_digests(kind.build_module, packages=kind_code_packages(kind))


def verify_digest(kind_name: str) -> dict[str, str]:
    """The code digest of a kind's verification, as its verification fingerprint holds it."""
    from edgebuild.core.fingerprint import code_digests, kind_code_packages
    from edgebuild.core.project import verify_roots
    from edgebuild.core.registry import get_kind

    kind = get_kind(kind_name)
    return code_digests(*verify_roots(kind), packages=kind_code_packages(kind))


# In every digest of every kind: the kind interface (with the bounded reader checkpoints are
# read through, the sizes it words errors with, and the consumer contract every build writes
# beside its outputs); in every verify digest also the judge.
KIND_INTERFACE = ["edgebuild/core/checkpoint.py", "edgebuild/core/console.py", "edgebuild/core/consumer.py",
                  "edgebuild/core/files.py", "edgebuild/core/kind.py"]
JUDGING = ["edgebuild/core/atomic.py", "edgebuild/core/hashing.py", "edgebuild/core/record.py",
           "edgebuild/core/report.py", "edgebuild/run/verification.py",
           # Along the chain and on data (edgebuild/run/chain.py), for every kind.
           "edgebuild/run/chain.py", "edgebuild/run/latency.py", "edgebuild/core/datasets.py", "edgebuild/core/inputs.py",
           "edgebuild/core/runner.py", "edgebuild/core/thresholds.py", "edgebuild/ml/agreement.py",
           "edgebuild/ml/compare.py", "edgebuild/ml/datasets.py", "edgebuild/ml/images.py", "edgebuild/targets/runners.py",
           "edgebuild/ml/statistics.py",
           # Coverage certificates and their gates (edgebuild/run/coverage.py), for every kind; each
           # target's own certificate code is in the digests of the kinds whose formats carry it.
           "edgebuild/run/coverage.py", "edgebuild/targets/coverage.py", "edgebuild/ml/modules.py"]
# The certificates of an ONNX graph (targets/formats.py's ONNX_GRAPH): in the verify digest
# of every kind that writes one.
ONNX_CERTIFICATES = ["edgebuild/targets/formats.py", "edgebuild/targets/onnx_graph.py",
                     "edgebuild/targets/directml_kernels.py"]
# In every built-in kind's build digest: its parameters' verify settings (core/thresholds.py).
VERIFY_SETTINGS = "edgebuild/core/thresholds.py"


def assert_code_digests(kind_name: str, build: list[str], verify: list[str]) -> None:
    """The kind's build digest covers exactly ``build`` (and the kind interface), its verify
    digest exactly ``verify`` (and the interface and the judge): what can change the
    artifact's bytes, and what judges it, and nothing else."""
    assert sorted(build_digest(kind_name)) == sorted(set(KIND_INTERFACE + [VERIFY_SETTINGS] + build))
    assert sorted(verify_digest(kind_name)) == sorted(set(KIND_INTERFACE + JUDGING + verify))


def verify_along(workspace, name: str, **options):
    """Verify what ``name`` is made from first (its verification counts only after theirs:
    the chain rule), then ``name``; return ``name``'s report."""
    from edgebuild.run.builder import verify_artifact

    *sources, artifact = workspace.order([workspace.artifact(name)])
    for source in sources:
        verify_artifact(workspace, source, **options)
    return verify_artifact(workspace, artifact, **options)


def pretend_built(workspace, name: str, outputs: dict[str, str] | None = None) -> dict[str, str]:
    """Write ``build/<name>/.edgebuild.json`` as a build of ``name`` at its current
    fingerprint would, listing ``outputs`` (relative path -> digest; default: one file
    whose digest is derived from the fingerprint) without writing them (an output that
    is there is recorded at its size): enough for an
    artifact made from ``name`` to have a fingerprint (it is keyed by its source's
    bytes), for tests of fingerprints that build nothing. Returns the outputs."""
    from edgebuild.core.hashing import digest_bytes
    from edgebuild.core.record import OutputFile

    artifact = workspace.artifact(name)
    record = artifact.record
    outputs = outputs if outputs is not None else {"model.onnx": digest_bytes(record.fingerprint.encode())}
    directory = artifact.directory
    directory.mkdir(parents=True, exist_ok=True)
    def size(path: str) -> int:
        return (directory / path).stat().st_size if (directory / path).is_file() else 1

    record.completed(name, {}, 0.0, {path: OutputFile(size=size(path), digest=digest)
                                     for path, digest in outputs.items()}).write(directory)
    return outputs


def vision_config_kind(package: str, kind: str, extra_build_module: bool = False) -> dict[str, str]:
    """The files of a small real kind, ``kind`` in package ``package``: its build writes a
    checkpoint's ``vision_config`` as JSON (reading that config section only), its
    verification checks the file against the checkpoint. For tests that add a kind the
    way a kind author does (a package of the copy, or a plugin)."""
    build_helpers = ("\nfrom .render import render\n" if extra_build_module else "\n\ndef render(section):\n    return json.dumps(section, sort_keys=True)\n")
    files = {
        "__init__.py": f'''
from typing import Literal

from edgebuild.plugin import ArtifactKind, ArtifactParams, Process, TensorSelection


class VisionConfigParams(ArtifactParams):
    kind: Literal["{kind}"]
    checkpoint: str


class VisionConfig(ArtifactKind):
    name = "{kind}"
    summary = "a checkpoint's vision_config as JSON"
    Params = VisionConfigParams
    outputs = ("vision_config.json",)
    build_module = "{package}.build"
    verify_module = "{package}.verify"

    def tensor_selection(self, params, checkpoint):
        return TensorSelection(prefixes=(), config_key="vision_config")
''',
        "build.py": f'''
import json

from edgebuild.plugin import BuildContext
{build_helpers}

def build(context: BuildContext) -> dict:
    (context.out_dir / "vision_config.json").write_text(render(context.checkpoint.config_section("vision_config")))
    return {{}}
''',
        "verify.py": '''
import json

from edgebuild.plugin import Check, Verification, VerifyContext


def verify(context: VerifyContext) -> Verification:
    written = json.loads((context.out_dir / "vision_config.json").read_text())
    same = written == context.checkpoint.config_section("vision_config")
    return Verification(checks=[Check.measure("matches_the_checkpoint", int(same), "==", 1)])
''',
    }
    if extra_build_module:
        files["render.py"] = "import json\n\n\ndef render(section):\n    return json.dumps(section, sort_keys=True)\n"
    return files


def lay_out_plugin(root: Path, package: str = "vc_plugin", version: str = "1.0", files: dict[str, str] | None = None,
                   entry: str = "vision_config_plugin = vc_plugin:VisionConfig") -> Path:
    """A distribution ``vc-plugin`` at ``version`` as pip would install it: the package and
    its ``.dist-info`` (metadata and entry points) in ``root``; ``files``: the package's
    (default: the vision_config kind of :func:`vision_config_kind`, with a module of its own)."""
    files = vision_config_kind("vc_plugin", "vision_config_plugin", extra_build_module=True) if files is None else files
    (root / package).mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / package / name).write_text(text.lstrip())
    info = root / f"vc_plugin-{version}.dist-info"
    for stale in root.glob("vc_plugin-*.dist-info"):
        for path in stale.iterdir():
            path.unlink()
        stale.rmdir()
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vc-plugin\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[edgebuild.kinds]\n{entry}\n")
    (info / "RECORD").write_text("")
    return root


def assert_quiet(result) -> None:
    """Edgebuild's own lines only -- doit's task lines, each artifact's "  [name] ..." lines
    and edgebuild's summary; no library's warning, log line or native note."""
    import re

    assert [line for line in result.stdout.splitlines()
            if not re.fullmatch(r"(\.|--)  (verify:)?[A-Za-z0-9_.-]+|verify: .*", line)] == [], result.stdout
    # stderr: each artifact's "  [name] ..." lines, edgebuild's own, and each report's summary
    # (report.md: its title, the warning of one judged on random inputs only, fingerprint and
    # table of checks).
    own = re.compile(r"  \[[A-Za-z0-9_.-]+\] |edgebuild: |# [A-Za-z0-9_.-]+ \(\w+\): (PASSED|FAILED)$|"
                     r"\*\*Judged on random inputs only\*\*: |fingerprint `[0-9a-f]{64}`$|\| .* \|$|$")
    assert [line for line in result.stderr.splitlines() if not own.match(line)] == [], result.stderr
    assert "Skipping constant folding" not in result.stderr


# --- damage and test data that never coincide with the original ------------------------


def flipped(data: bytes, offset: int, mask: int = 0xFF) -> bytes:
    """``data`` with the byte at ``offset`` (from the end when negative) XORed with ``mask``:
    the same size, never the same bytes. Writing a constant instead (a zero byte over random
    bytes) changes nothing one time in 256, and the test that damaged nothing fails by chance."""
    assert mask & 0xFF, "a zero mask flips nothing"
    damaged = bytearray(data)
    damaged[offset] ^= mask & 0xFF
    return bytes(damaged)


def flip_bits(path: Path, offset: int, mask: int = 0xFF) -> None:
    """Damage the file ``path`` in place as :func:`flipped` does its bytes: same size, same
    inode, the byte at ``offset`` (from the end when negative) always different."""
    assert mask & 0xFF, "a zero mask flips nothing"
    with open(path, "r+b") as handle:
        handle.seek(offset, os.SEEK_END if offset < 0 else os.SEEK_SET)
        position = handle.tell()
        (byte,) = handle.read(1)
        handle.seek(position)
        handle.write(bytes([byte ^ (mask & 0xFF)]))


def seeded_bytes(size: int, seed: int) -> bytes:
    """``size`` bytes that look random and are the same on every run, so a failure reruns as
    it failed (``os.urandom`` makes each run a different test)."""
    import random

    return random.Random(seed).randbytes(size)


def signer(prefix: Path):
    """The keys of a runner that signs with ``PREFIX.key`` (and trusts its own key)."""
    from edgebuild.cache.signing import Trust, key_id, load_private_key

    private = load_private_key(Path(f"{prefix}.key"))
    return Trust(private, {key_id(private.public_key()): private.public_key()})


def trusting(*prefixes: Path):
    """The keys of a runner that trusts ``PREFIX.pub`` for each prefix, and signs nothing."""
    from edgebuild.cache.signing import Trust, key_id, load_public_key

    public = [load_public_key(Path(f"{prefix}.pub")) for prefix in prefixes]
    return Trust(None, {key_id(key): key for key in public})


def signing_env(keys: dict, remote: str | None = None) -> dict[str, str]:
    """The environment of a team's runner: it signs with the team's key (which it thereby
    trusts) -- what every runner that shares through a remote is given in these tests."""
    env = {"EDGEBUILD_SIGNING_KEY": f"{keys['team']}.key", "EDGEBUILD_TRUSTED_KEYS": f"{keys['team']}.pub"}
    return env | ({"EDGEBUILD_REMOTE_CACHE": remote} if remote is not None else {})


def made_once(tmp_path_factory: "pytest.TempPathFactory", name: str, make: Callable[[Path], object]) -> Path:
    """A directory ``make(directory)`` fills once for the whole run: under pytest-xdist the
    first worker to ask makes it in the run's shared temporary folder while the others
    wait on a lock, then all read it (tests copy what they change). Made fresh if an
    earlier attempt failed half-way."""
    import fcntl

    if "PYTEST_XDIST_WORKER" not in os.environ:
        directory = tmp_path_factory.mktemp(name)
        make(directory)
        return directory
    directory = tmp_path_factory.getbasetemp().parent / f"made-once-{name}"
    with open(f"{directory}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (directory / ".made").exists():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            make(directory)
            (directory / ".made").touch()
    return directory


@contextmanager
def waits_released(fifo: Path, seconds: float = 10) -> Iterator[list[str]]:
    """Within the block, a reader still waiting on the FIFO ``fifo`` after ``seconds`` is let
    go (a writer opens it and closes it at once: the reader finds it empty), and the list
    yielded gets a line saying so. A test asserts the list is empty: a read that would wait
    forever fails the test instead of hanging it."""
    released: list[str] = []
    done = threading.Event()

    def release() -> None:
        if done.wait(seconds):
            return
        while not done.wait(0.05):
            try:
                # Non-blocking: succeeds only while a reader waits on the other end.
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                continue
            released.append(f"a reader waited on {fifo} for more than {seconds} s")

    releaser = threading.Thread(target=release, daemon=True)
    releaser.start()
    try:
        yield released
    finally:
        done.set()
        releaser.join()


def settle() -> None:
    """Let files just written stop being racily clean (``statcache.RACY_NS``): a file
    read in the tick it was written is read again by the next process, so a check that a
    no-op reads nothing starts from files written before."""
    import time

    from edgebuild.core.statcache import RACY_NS

    time.sleep(RACY_NS * 1.5 / 1e9)
