"""``doit clean``: doit's own, saying what it removes and nothing more."""

from __future__ import annotations

import io

from doit.cmd_clean import Clean as DoitClean

from edgebuild.cli.common import OneLineErrors


class Clean(OneLineErrors, DoitClean):
    """doit's ``clean``, saying what it removes: doit writes ``NAME - executing 'Python:
    function _clean_action'`` for every clean action and keeps what the action printed
    to itself; here the action's own line (``removed build/NAME``) is shown, and
    doit's only with ``-v`` (or ``EDGEBUILD_VERBOSE=1``)."""

    name = "clean"
    doc_purpose = "remove the built artifacts (build/<name>; the store keeps them)"
    cmd_options = DoitClean.cmd_options + (
        {"name": "verbose", "short": "v", "long": "verbose", "type": bool, "default": False,
         "help": "also show each clean action doit executes"},
    )

    def _execute(self, dryrun, cleandep, cleanall, cleanforget, verbose=False, pos_args=None):  # noqa: D102
        from edgebuild.core.config import Settings

        self._show_doit_lines = verbose or Settings.from_environ().verbose
        return super()._execute(dryrun, cleandep, cleanall, cleanforget, pos_args=pos_args)

    def clean_tasks(self, tasks, dryrun, cleanforget):  # noqa: D102 - doit's signature
        shown = self.outstream
        if not self._show_doit_lines:
            self.outstream = io.StringIO()
        try:
            super().clean_tasks(tasks, dryrun, cleanforget)
        finally:
            self.outstream = shown
        if self._show_doit_lines:
            return  # doit wrote the actions' output too
        seen = set()
        for task in tasks:
            if task.name in seen:
                continue
            seen.add(task.name)
            for action in task.clean_actions:
                if getattr(action, "out", None):
                    shown.write(action.out)
        shown.flush()
