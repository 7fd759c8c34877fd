"""What git says of the work tree holding the project: the commit checked out, what
differs from it (provenance and ``publish``'s clean-tree rule), and the committed bytes of
a file (the shard partition reads the committed lock file, not the one a run rewrote)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

GIT_TIMEOUT_SECONDS = 60


def _git(directory: Path, *args: str, text: bool = True) -> subprocess.CompletedProcess | None:
    """``git args`` run in ``directory``; ``None`` without git (or when it hangs)."""
    try:
        return subprocess.run(["git", *args], cwd=directory, capture_output=True, text=text, timeout=GIT_TIMEOUT_SECONDS)
    except (OSError, subprocess.TimeoutExpired):
        return None


def work_tree_top(directory: Path) -> Path | None:
    """The top of the git work tree holding ``directory``; ``None`` outside one (or without git)."""
    top = _git(directory, "rev-parse", "--show-toplevel")
    if top is None or top.returncode != 0 or not top.stdout.strip():
        return None
    return Path(top.stdout.strip())


def is_ignored(top: Path, path: Path) -> bool:
    """Whether git ignores ``path`` (a directory that may not exist yet) in the work tree at ``top``."""
    relative = path.resolve().relative_to(top.resolve()).as_posix()
    if relative == ".":
        return False
    checked = _git(top, "check-ignore", "-q", "--no-index", "--", relative + "/")
    return checked is not None and checked.returncode == 0


def committed_bytes(path: Path, limit: int, revision: str = "HEAD") -> bytes | None:
    """The bytes of ``path`` as committed at ``revision`` (a commit of the git work tree
    holding it); ``None`` outside a git work tree, before the first commit, when git does
    not track ``path`` at ``revision``, or when the committed file holds more than
    ``limit`` bytes."""
    directory = path.parent
    prefix = _git(directory, "rev-parse", "--show-prefix")
    if prefix is None or prefix.returncode != 0:
        return None
    spec = f"{revision}:{prefix.stdout.strip()}{path.name}"
    size = _git(directory, "cat-file", "-s", spec)
    if size is None or size.returncode != 0 or not size.stdout.strip().isdigit() or int(size.stdout) > limit:
        return None
    shown = _git(directory, "cat-file", "blob", spec, text=False)
    return shown.stdout if shown is not None and shown.returncode == 0 else None


def resolve_commit(directory: Path, revision: str) -> str | None:
    """The commit ``revision`` (a branch, tag, ``HEAD~2``, a hash) names in the git work tree
    holding ``directory``; ``None`` when it names none (or outside a work tree)."""
    if revision.startswith("-"):
        return None  # never an option to git
    resolved = _git(directory, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
    if resolved is None or resolved.returncode != 0:
        return None
    return resolved.stdout.strip() or None


def git_state(directory: Path, ignore: tuple[Path, ...] = (), tracked: tuple[Path, ...] = ()) -> dict[str, Any] | None:
    """``{"top", "commit", "changes"}`` of the git work tree holding ``directory``:
    its top directory, the commit checked out (``None`` before the first one), and
    the files that differ from it -- tracked files changed (except ``ignore``) and
    the files of ``tracked`` that git does not track -- as paths from the top.
    ``None`` outside a git work tree, or without git."""

    def git(*args: str) -> subprocess.CompletedProcess[str] | None:
        return _git(directory, *args)

    top = git("rev-parse", "--show-toplevel")
    if top is None or top.returncode != 0:
        return None
    root = Path(top.stdout.strip())
    head = git("rev-parse", "--verify", "--quiet", "HEAD")
    commit = head.stdout.strip() if head is not None and head.returncode == 0 else None
    status = git("status", "--porcelain=v1", "-z", "--untracked-files=no")
    if status is None or status.returncode != 0:
        return None
    ignored = {_from_top(path, root) for path in ignore}
    changes = []
    records = iter(status.stdout.split("\0"))
    for record in records:
        if len(record) < 4:
            continue
        if record[0] in "RC":
            next(records, None)  # the name it was renamed or copied from
        path = record[3:]
        if path not in ignored:
            changes.append(path)
    # The files of ``tracked`` inside the work tree, asked about in one call (a calibration
    # glob may match hundreds); a file outside the work tree is no commit's to hold.
    inside = {_from_top(path, root): path for path in tracked if not Path(_from_top(path, root)).is_absolute()}
    if inside:
        listed = _git(root, "--literal-pathspecs", "ls-files", "-z", "--full-name", "--", *sorted(inside))
        known = set(listed.stdout.split("\0")) if listed is not None and listed.returncode == 0 else set()
        changes += [f"{relative} (untracked)" for relative in sorted(inside) if relative not in known]
    return {"top": str(root), "commit": commit, "changes": changes}


def _from_top(path: Path, top: Path) -> str:
    try:
        return Path(path).resolve().relative_to(top.resolve()).as_posix()
    except ValueError:
        return str(path)
