"""The model of a project: manifest, kinds, checkpoints, fingerprints, records.

Nothing here builds, shares or prints: ``cache/`` keeps bytes, ``run/`` does the
work, ``cli/`` talks to people. Modules here import only each other (and
``edgebuild.errors``).
"""
