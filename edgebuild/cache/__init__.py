"""Where built bytes are kept: the local content-addressed store, remote locations, the remote cache.

Imports ``core/`` only: a cache knows records and digests, never how an artifact
is made or judged.
"""
