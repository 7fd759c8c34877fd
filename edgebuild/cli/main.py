"""``python -m edgebuild``: helpers around the doit tasks.

    python -m edgebuild init [DIR] [--ci github|script]
                                          start a project: dodo.py, a starter manifest, its schema (and CI)
    python -m edgebuild schema            the manifest's JSON Schema (editor completion)
    python -m edgebuild check [--deep]    validate the manifest and print what it declares
    python -m edgebuild fixture NAME DIR  write a generated tiny checkpoint to DIR
    python -m edgebuild keygen PREFIX     write a signing key pair: PREFIX.key (private) and PREFIX.pub
    python -m edgebuild fetch NAME --from DEST --to DIR [--fingerprint FP | --commit SHA]
                                          download a published artifact, checked and signed
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edgebuild.errors import EdgebuildError


def build_parser() -> argparse.ArgumentParser:
    """The commands and options of ``python -m edgebuild`` (the reference pages are made from it)."""
    parser = argparse.ArgumentParser(prog="python -m edgebuild", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    init = commands.add_parser(
        "init", help="write dodo.py, a starter artifacts.yaml and its schema into DIR (never overwrites)"
    )
    init.add_argument("directory", nargs="?", default=".", type=Path, metavar="DIR")
    init.add_argument("--ci", choices=("github", "script"), default=None,
                      help="also write CI for the repository: ci/edgebuild.sh, and with 'github' the workflow "
                      ".github/workflows/edgebuild.yml that runs it")
    commands.add_parser("schema", help="print the manifest's JSON Schema")
    fixture = commands.add_parser("fixture", help="write a generated tiny checkpoint")
    fixture.add_argument("name")
    fixture.add_argument("directory", type=Path)
    check = commands.add_parser("check", help="validate the manifest")
    check.add_argument("manifest", nargs="?", default=None)
    check.add_argument(
        "--deep", action="store_true",
        help="also open the checkpoints and input files and check every artifact's parameters against them",
    )
    keygen = commands.add_parser(
        "keygen", help="write an ECDSA P-256 key pair for signing remote-cache entries: PREFIX.key (mode 0600) "
        "and PREFIX.pub (never overwrites)",
    )
    keygen.add_argument("prefix", type=Path, metavar="PREFIX")
    fetch = commands.add_parser(
        "fetch", help="download a published artifact into DIR after checking every byte against SHA256SUMS and its "
        "signature against EDGEBUILD_TRUSTED_KEYS (the latest published, unless --fingerprint or --commit)",
    )
    fetch.add_argument("name", metavar="NAME")
    fetch.add_argument("--from", dest="source", required=True, metavar="DEST",
                       help="where it was published: a directory or an fsspec URL (doit publish --to)")
    fetch.add_argument("--to", dest="target", required=True, type=Path, metavar="DIR",
                       help="a directory to create (or an empty one)")
    which = fetch.add_mutually_exclusive_group()
    which.add_argument("--fingerprint", metavar="FP", help="this published build (at least 7 hex digits)")
    which.add_argument("--commit", metavar="SHA", help="the newest build published from this commit")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "init":
            from edgebuild.cli.scaffold import describe, init_project

            result = init_project(args.directory, ci=args.ci)
            print(describe(result, str(args.directory)))
        elif args.command == "schema":
            from edgebuild.core.manifest import manifest_json_schema

            def skipped(error: EdgebuildError) -> None:
                print(f"edgebuild: warning: {error}; its parameters are not in the schema", file=sys.stderr)

            print(json.dumps(manifest_json_schema(on_error=skipped), indent=2))
        elif args.command == "fixture":
            from edgebuild.core.fixtures import write_fixture
            from edgebuild.core.registry import fixtures

            if args.name not in fixtures():
                parser.error(f"unknown fixture {args.name!r}; expected one of {', '.join(fixtures())}")
            write_fixture(args.directory, args.name)
            print(args.directory)
        elif args.command == "check":
            return _check(args.manifest, args.deep)
        elif args.command == "fetch":
            from edgebuild.core.config import Settings
            from edgebuild.run.fetch import fetch as fetch_artifact

            settings = Settings.from_environ()
            fetch_artifact(args.name, args.source, args.target, fingerprint=args.fingerprint, commit=args.commit,
                           trusted_keys=settings.trusted_key_paths, s3_endpoint=settings.s3_endpoint)
        elif args.command == "keygen":
            from edgebuild.cache.signing import generate, key_id, load_public_key

            private_path, public_path = generate(args.prefix)
            print(f"wrote {private_path} (private: EDGEBUILD_SIGNING_KEY on the runners that push; keep it secret) "
                  f"and {public_path} (public: EDGEBUILD_TRUSTED_KEYS where builds are pulled)")
            print(f"key id {key_id(load_public_key(public_path))[:16]}")
    except EdgebuildError as error:
        print(f"edgebuild: error: {error}", file=sys.stderr)
        return 2
    return 0


def _check(manifest_path: str | None, deep: bool) -> int:
    """Print each artifact (name, kind, description); with ``deep``, first check each
    one as its build would, and report every problem found, not only the first."""
    from edgebuild.core.config import Settings
    from edgebuild.core.manifest import load_manifest
    from edgebuild.core.project import Project

    project = Project(load_manifest(manifest_path or Settings.from_environ().manifest))
    problems = []
    if deep:
        for artifact in project.order():
            try:
                project.check(artifact)
            except EdgebuildError as error:
                problems.append(str(error))
    for artifact in project.artifacts:
        print(f"{artifact.name}\t{artifact.kind.name}\t{artifact.params.description}")
    for problem in problems:
        print(f"edgebuild: error: {problem}", file=sys.stderr)
    return 2 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
