"""The engine: a workspace, the one scheduler, workers, and what runs share.

Everything that builds, verifies, pushes, pulls or publishes an artifact is here,
and is used the same way by the doit commands, the Python API and a cluster's jobs.
Imports ``core/`` and ``cache/``; knows kinds only through the registry.
"""
