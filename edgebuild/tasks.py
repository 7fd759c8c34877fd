"""What a project's ``dodo.py`` imports: the doit tasks of its manifest.

A stable name for the three functions every generated ``dodo.py`` calls (their
code is ``edgebuild/cli/tasks.py``)::

    from edgebuild.tasks import artifact_tasks, doit_config, load_or_exit
"""

from edgebuild.cli.tasks import artifact_tasks, doit_config, load_or_exit

__all__ = ["artifact_tasks", "doit_config", "load_or_exit"]
