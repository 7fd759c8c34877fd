"""doit entry point: every task comes from the manifest (``artifacts.yaml``, or
the file named by ``EDGEBUILD_MANIFEST``). Nothing else lives here."""

from edgebuild.tasks import artifact_tasks, doit_config, load_or_exit

PROJECT = load_or_exit()
DOIT_CONFIG = doit_config(PROJECT)


def task_artifacts():
    yield from artifact_tasks(PROJECT)
