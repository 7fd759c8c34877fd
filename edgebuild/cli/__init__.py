"""How people drive edgebuild: one module per doit command, ``python -m edgebuild``, the report page.

A command parses its options, calls the engine (``run/``) and prints what came
back; nothing here builds or judges anything itself.
"""
