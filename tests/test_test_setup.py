"""The test set-up's promise: in CI (``EDGEBUILD_REQUIRE_ALL_TESTS=1``, set by .ci/run and
scripts/ci_steps.sh) a test skipped for want of what the set-up installs fails; a skip
for what no set-up installs stays a skip; elsewhere both skip. Run in a pytest of its own
with this suite's conftest, on a test file written here."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from helpers import REPO, REQUIRE_ALL_TESTS

TWO_SKIPS = '''
import pytest

from helpers import needs


@needs("chromium")
def test_in_a_browser():
    pass


def test_on_a_reflink_filesystem():
    pytest.skip("this machine has no reflink filesystem, which no test set-up installs")
'''


def _pytest(directory: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items() if key != REQUIRE_ALL_TESTS}
    # The installed plugins (xdist, dask's, ...) are not loaded: two seconds a run, and none takes part.
    environment |= {"PYTHONPATH": str(REPO / "tests"), "EDGEBUILD_TEST_CHROMIUM": str(directory / "no-chromium"),
                    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", **variables}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q", "-rs",
                           str(directory / "test_two_skips.py")], cwd=directory, env=environment,
                          capture_output=True, text=True, timeout=120)


def test_a_missing_dependency_the_set_up_installs_fails_only_where_required(tmp_path: Path) -> None:
    (tmp_path / "test_two_skips.py").write_text(textwrap.dedent(TWO_SKIPS))
    required = _pytest(tmp_path, **{REQUIRE_ALL_TESTS: "1"})
    assert required.returncode == 1, required.stdout + required.stderr
    assert (f"{tmp_path / 'test_two_skips.py'}:7: missing, though the test set-up installs it: EDGEBUILD_TEST_CHROMIUM="
            f"{tmp_path / 'no-chromium'} is not an executable; {REQUIRE_ALL_TESTS}=1 makes this a failure, not a "
            "skip (unset it to skip)\n") in required.stdout
    assert ("SKIPPED [1] test_two_skips.py:13: this machine has no reflink filesystem, which no test set-up installs\n"
            "1 skipped, 1 error in ") in required.stdout

    elsewhere = _pytest(tmp_path)
    assert elsewhere.returncode == 0, elsewhere.stdout + elsewhere.stderr
    assert (f"SKIPPED [1] test_two_skips.py:7: missing, though the test set-up installs it: EDGEBUILD_TEST_CHROMIUM="
            f"{tmp_path / 'no-chromium'} is not an executable\n") in elsewhere.stdout
    assert "\n2 skipped in " in elsewhere.stdout
