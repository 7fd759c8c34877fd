"""doit's own commands (``run``, ``list``, ...), ending a misused option with one line.

Each is exactly doit's but for that, as every edgebuild command does it; ``list``
also leaves out the ``verify:NAME`` tasks when it would not show them.

doit's message for an unknown option lists every option object it knows
(``CmdOption({'name':'dep_file', ...})``, thirteen of them for ``doit list``), and
for a value of the wrong type it prints Python's ``int()`` error on two lines. These
commands replace doit's through the same entry point group as edgebuild's own
(``doit.COMMAND`` in ``pyproject.toml``); doit takes a plugin command of a built-in's
name in its place. ``clean`` has its own module (it also says less per action).
"""

from __future__ import annotations

from doit.cmd_dumpdb import DumpDB as DoitDumpDB
from doit.cmd_forget import Forget as DoitForget
from doit.cmd_ignore import Ignore as DoitIgnore
from doit.cmd_info import Info as DoitInfo
from doit.cmd_list import List as DoitList
from doit.cmd_resetdep import ResetDep as DoitResetDep
from doit.cmd_run import Run as DoitRun
from doit.cmd_strace import Strace as DoitStrace
from doit.cmd_completion import TabCompletion as DoitTabCompletion

from doit.exceptions import InvalidCommand

from edgebuild.cli.common import OneLineErrors
from edgebuild.cli.tasks import verify_subtasks_only_if


def _one_line_errors(command: type) -> type:
    """doit's ``command`` with :class:`OneLineErrors`, under doit's own name for it."""
    return type(command.__name__, (OneLineErrors, command), {"__doc__": command.__doc__, "name": command.get_name(),
                                                            "__module__": __name__})


Run = _one_line_errors(DoitRun)
Forget = _one_line_errors(DoitForget)
Ignore = _one_line_errors(DoitIgnore)
DumpDB = _one_line_errors(DoitDumpDB)
Strace = _one_line_errors(DoitStrace)
ResetDep = _one_line_errors(DoitResetDep)
TabCompletion = _one_line_errors(DoitTabCompletion)


class List(OneLineErrors, DoitList):
    __doc__ = DoitList.__doc__
    name = "list"

    def execute(self, params, args):  # noqa: D102 - doit's signature
        # Groups only (no --all, no task named): the verify:NAME tasks would not be shown,
        # so they are not made (edgebuild/cli/tasks.py); what is printed is the same.
        # Decided when the tasks are made: the dodo file's DOIT_CONFIG may set subtasks.
        with verify_subtasks_only_if(lambda: bool(params["subtasks"] or args)):
            return super().execute(params, args)


class Info(OneLineErrors, DoitInfo):
    __doc__ = DoitInfo.__doc__
    name = "info"

    def _execute(self, pos_args, hide_status=False):  # noqa: D102 - doit's signature
        # doit's own looks the name up unchecked: a KeyError traceback for a name it lacks.
        if len(pos_args) == 1 and pos_args[0] not in {task.name for task in self.task_list}:
            raise InvalidCommand(not_found=pos_args[0])
        return super()._execute(pos_args, hide_status=hide_status)
