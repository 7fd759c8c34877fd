"""``python -m edgebuild``: helpers around the doit tasks.

    python -m edgebuild schema            the manifest's JSON Schema (editor completion)
    python -m edgebuild fixture NAME DIR  write a generated tiny checkpoint to DIR
    python -m edgebuild check             validate the manifest and print what it declares
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import EdgebuildError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgebuild", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("schema", help="print the manifest's JSON Schema")
    fixture = commands.add_parser("fixture", help="write a generated tiny checkpoint")
    fixture.add_argument("name")
    fixture.add_argument("directory", type=Path)
    check = commands.add_parser("check", help="validate the manifest")
    check.add_argument("manifest", nargs="?", default=None)
    args = parser.parse_args(argv)
    try:
        if args.command == "schema":
            from .manifest import manifest_json_schema

            print(json.dumps(manifest_json_schema(), indent=2))
        elif args.command == "fixture":
            from .fixtures import FIXTURES, write_fixture

            if args.name not in FIXTURES:
                parser.error(f"unknown fixture {args.name!r}; expected one of {', '.join(FIXTURES)}")
            write_fixture(args.directory, args.name)
            print(args.directory)
        elif args.command == "check":
            from .kinds import get_kind
            from .manifest import load_manifest

            manifest = load_manifest(args.manifest)
            for name, params in manifest.artifacts.items():
                print(f"{name}\t{get_kind(params.kind).name}\t{params.description}")
    except EdgebuildError as error:
        print(f"edgebuild: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
