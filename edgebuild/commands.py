"""doit commands: ``doit build [NAME...]`` and ``doit verify [NAME...]``.

They are doit's own ``run`` with the task selection translated from artifact
names, so every ``run`` option (``-n 2``, ``--continue``, ``-v``) keeps working.
Registered in ``pyproject.toml`` under ``[tool.doit.plugins.command]``.
"""

from __future__ import annotations

import difflib

from doit.cmd_run import Run
from doit.exceptions import InvalidCommand

from .errors import EdgebuildError


def _artifact_names() -> list[str]:
    from .tasks import load_or_exit

    return list(load_or_exit().manifest.order())


def _selected(args: list[str], names: list[str]) -> list[str]:
    unknown = [arg for arg in args if arg not in names]
    if unknown:
        match = difflib.get_close_matches(unknown[0], names, n=1)
        hint = f" (did you mean {match[0]!r}?)" if match else ""
        raise InvalidCommand(f"unknown artifact {unknown[0]!r}{hint}; `doit list` shows the artifacts")
    return args or names


class Build(Run):
    name = "build"
    doc_purpose = "build artifacts (all, or the ones named) and what they depend on"
    doc_usage = "[ARTIFACT ...]"
    doc_description = "Rebuilds only what is stale; up-to-date artifacts are skipped."

    def execute(self, params, args):  # noqa: D102 - doit's signature
        try:
            selected = _selected(args, _artifact_names())
        except EdgebuildError as error:
            raise InvalidCommand(str(error)) from None
        return super().execute(params, selected)


class Verify(Run):
    name = "verify"
    doc_purpose = "build what is stale, then verify artifacts (all, or the ones named)"
    doc_usage = "[ARTIFACT ...]"
    doc_description = (
        "Writes build/<name>/report.json and report.md; exits non-zero if any check fails."
    )

    def execute(self, params, args):  # noqa: D102 - doit's signature
        selected = _selected(args, _artifact_names())
        return super().execute(params, [f"verify:{name}" for name in selected])
