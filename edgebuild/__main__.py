"""``python -m edgebuild``: see ``edgebuild/cli/main.py``."""

from edgebuild.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
