"""``python -m edgebuild``: helpers around the doit tasks.

    python -m edgebuild init [DIR] [--ci github|script [--requirement REQ ...] [--refresh-requirements]] [--plugins]
                                          start a project: dodo.py, a starter manifest, its schema (and CI)
    python -m edgebuild schema            the manifest's JSON Schema (editor completion)
    python -m edgebuild check [--deep] [--ci]
                                          validate the manifest and print what it declares
    python -m edgebuild fixture NAME DIR  write a generated tiny checkpoint to DIR
    python -m edgebuild keygen PREFIX     write a signing key pair: PREFIX.key (private) and PREFIX.pub
    python -m edgebuild fetch NAME --from DEST --to DIR [--fingerprint FP | --commit SHA]
                                          download a published artifact, checked and signed
    python -m edgebuild merge-locks [LOCK ...]
                                          CI: the lock files the shards wrote, as one; is it the committed one?
    python -m edgebuild toolenv TOOL [DIR]
                                          make the environment a tool that cannot share edgebuild's runs in
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NoReturn

from edgebuild.errors import EdgebuildError


class _Parser(argparse.ArgumentParser):
    """argparse's parser, but a misused option is one line, as every edgebuild error is
    (argparse prints the whole usage first); ``--help`` still shows the usage."""

    def error(self, message: str) -> NoReturn:
        print(f"edgebuild: error: {self.prog}: {message}; `{self.prog} --help` shows the usage", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    """The commands and options of ``python -m edgebuild`` (the reference pages are made from it)."""
    parser = _Parser(prog="python -m edgebuild", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    init = commands.add_parser(
        "init", help="write dodo.py, a starter artifacts.yaml and its schema into DIR (never overwrites)"
    )
    init.add_argument("directory", nargs="?", default=".", type=Path, metavar="DIR")
    init.add_argument("--ci", choices=("github", "script"), default=None,
                      help="also write CI for the repository: ci/requirements.txt, ci/edgebuild.sh, and with 'github' "
                      "the workflow .github/workflows/edgebuild.yml that runs it")
    init.add_argument("--requirement", action="append", default=[], metavar="REQ",
                      help="with --ci: where a runner installs a package from, as a line of ci/requirements.txt "
                      "('edgebuild @ git+https://HOST/ORG/edgebuild@TAG', a wheel's URL, or NAME==VERSION); "
                      "by default each package as it is installed here (repeatable)")
    init.add_argument("--refresh-requirements", action="store_true",
                      help="with --ci: write ci/requirements.txt again from the manifest as it is now (the extras its "
                      "kinds and verify settings need); every other file is kept")
    init.add_argument("--plugins", action="store_true",
                      help="also the starters and parameters of the installed plugin kinds (imports each one)")
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
    check.add_argument(
        "--ci", action="store_true",
        help="as a CI runner (ci/edgebuild.sh --check): a path: checkpoint that is not there is one line saying how a "
        "runner gets it",
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
    merge = commands.add_parser(
        "merge-locks", help="merge the lock files CI shards wrote into the manifest's lock file, then exit 1 if it "
        "differs from the one committed at HEAD in anything but costs (ci/edgebuild.sh --lock)",
    )
    merge.add_argument("locks", nargs="*", type=Path, metavar="LOCK",
                       help="a lock file a shard wrote (doit verify --shard I/N)")
    toolenv = commands.add_parser(
        "toolenv", help="make the environment of a tool that cannot share edgebuild's (a kind's converter): a "
        "virtual environment beside edgebuild's, with the tool's packages",
    )
    toolenv.add_argument("tool", nargs="?", help="the tool, as a kind names it (--list lists them; or --needed: "
                         "those the manifest's kinds need)")
    toolenv.add_argument("directory", nargs="?", type=Path, default=None, metavar="DIR",
                         help="where (default: .venv-TOOL beside the environment edgebuild runs in; elsewhere, "
                         "set EDGEBUILD_<TOOL>_PYTHON to DIR/bin/python)")
    toolenv.add_argument("--needed", action="store_true",
                         help="make the environments the manifest's kinds need, that are not there (CI)")
    toolenv.add_argument("--list", dest="list_tools", action="store_true",
                         help="list the tools the installed kinds run in environments of their own, and exit")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        from edgebuild.core.config import Settings
        from edgebuild.core.console import quiet_logging

        if not Settings.from_environ().verbose:
            quiet_logging()
        if args.command == "init":
            from edgebuild.cli.scaffold import describe, init_project

            result = init_project(args.directory, ci=args.ci, plugins=args.plugins, requirements=args.requirement,
                                  refresh_requirements=args.refresh_requirements)
            for problem in result.plugin_errors:
                print(f"edgebuild: warning: {problem}; its starter and parameters are left out", file=sys.stderr)
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
            return _check(args.manifest, args.deep, args.ci)
        elif args.command == "merge-locks":
            return _merge_locks(args.locks)
        elif args.command == "fetch":
            from edgebuild.core.config import Settings
            from edgebuild.run.fetch import fetch as fetch_artifact

            settings = Settings.from_environ()
            fetch_artifact(args.name, args.source, args.target, fingerprint=args.fingerprint, commit=args.commit,
                           trusted_keys=settings.trusted_key_paths, s3_endpoint=settings.s3_endpoint)
        elif args.command == "toolenv":
            return _toolenv(parser, args.tool, args.directory, args.needed, args.list_tools)
        elif args.command == "keygen":
            from edgebuild.cache.signing import generate, key_id, load_public_key

            private_path, public_path = generate(args.prefix)
            print(f"wrote {private_path} (private: EDGEBUILD_SIGNING_KEY on the runners that push; keep it secret) "
                  f"and {public_path} (public: EDGEBUILD_TRUSTED_KEYS where builds are pulled)")
            print(f"key id {key_id(load_public_key(public_path))[:16]}")
    except EdgebuildError as error:
        print(f"edgebuild: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        from edgebuild.core.console import reader_gone

        return reader_gone()
    return 0


def _toolenv(parser: argparse.ArgumentParser, tool: str | None, directory: Path | None, needed: bool,
             list_tools: bool = False) -> int:
    """Make tool environment ``tool`` (at ``directory``), or with ``needed`` those the
    manifest's kinds name that are not there yet; with ``list_tools``, list them."""
    import subprocess

    from edgebuild.core.registry import all_kinds, get_kind
    from edgebuild.targets.toolenv import make, missing_reason

    if list_tools:
        for kind in all_kinds(on_error=lambda error: None):
            for environment in kind.tool_environments:
                state = missing_reason(environment) or "made"
                print(f"{environment.name}\t{kind.name}\t{environment.module}\t{state}")
        return 0
    if needed == (tool is not None):
        parser.error("toolenv: give a tool, or --needed")
    if needed:
        from edgebuild.core.manifest import load_manifest

        kinds = {params.kind for params in load_manifest().artifacts.values()}
        found = {environment.name: environment for kind in sorted(kinds) for environment in get_kind(kind).tool_environments}
        environments = [environment for _, environment in sorted(found.items()) if missing_reason(environment) is not None]
    else:
        known = {environment.name: environment for kind in all_kinds(on_error=lambda error: None)
                 for environment in kind.tool_environments}
        if tool not in known:
            parser.error(f"toolenv: no installed kind runs a tool named {tool!r} in an environment of its own "
                         f"(the tools: {', '.join(sorted(known)) or 'none'})")
        environments = [known[str(tool)]]
    for environment in environments:
        try:
            print(make(environment, directory))
        except (OSError, subprocess.CalledProcessError) as error:
            raise EdgebuildError(f"toolenv {environment.name}: {error}") from None
    return 0


def _check(manifest_path: str | None, deep: bool, ci: bool = False) -> int:
    """Print each artifact (name, kind, description); with ``deep``, first check each
    one as its build would, and report every problem found, not only the first. With
    ``ci``, a ``path:`` checkpoint that is not there says what a CI runner needs instead
    (its artifacts are not checked further)."""
    from edgebuild.core.config import Settings
    from edgebuild.core.manifest import load_manifest
    from edgebuild.core.project import BuildGraph

    project = BuildGraph(load_manifest(manifest_path or Settings.from_environ().manifest))
    problems = []
    absent = _absent_on_runner(project) if ci else {}
    problems += absent.values()
    if ci:
        problems += _requirements_problems(project)
    if deep:
        for artifact in project.order():
            if absent.keys() & set(artifact.params.checkpoint_names()):
                continue
            try:
                project.check(artifact)
                _check_dataset(project, artifact)
            except EdgebuildError as error:
                problems.append(str(error))
    for artifact in project.artifacts:
        print(f"{artifact.name}\t{artifact.kind.name}\t{artifact.params.description}")
    for problem in problems:
        print(f"edgebuild: error: {problem}", file=sys.stderr)
    return 2 if problems else 0


def _check_dataset(project, artifact) -> None:
    """A dataset gate's files are there (a glob that matches nothing would fail every
    verification, and every status after it): :class:`EdgebuildError` naming the key."""
    from edgebuild.core.datasets import dataset_files
    from edgebuild.core.thresholds import dataset_gate

    gate = dataset_gate(artifact.params)
    if gate is not None and not gate.builtin:
        dataset_files(gate, project.manifest.root, artifact.where("verify", "dataset"))


def _requirements_problems(project) -> list[str]:
    """What ``ci/requirements.txt`` beside the manifest lacks of what the manifest needs on a
    runner (an extra for a built-in dataset gate): the shards would fail where the check passed."""
    from edgebuild.cli.ci_template import REQUIREMENTS_FILE, manifest_extras, missing_extras
    from edgebuild.core.files import UnreadableFile, read_text

    path = project.manifest.root / REQUIREMENTS_FILE
    try:
        text = read_text(path, 1 << 20)
    except FileNotFoundError:
        return []
    except (OSError, UnreadableFile) as error:
        return [f"{path}: cannot read it ({error})"]
    return [f"{project.manifest.root / problem}" for problem in missing_extras(text, manifest_extras(project.manifest))]


def _absent_on_runner(project) -> dict[str, str]:
    """Checkpoint name -> the line for each ``path:`` checkpoint whose directory is not
    on this machine, saying how a CI runner gets one."""
    absent = {}
    for name, spec in project.manifest.checkpoints.items():
        if spec.uses_fixture or spec.hf:
            continue
        directory = project.path_checkpoint_directory(name)
        if directory.is_dir():
            continue
        where = project.manifest.source.where(("checkpoints", name, "path"))
        absent[name] = (
            f"{where}: checkpoints -> {name} -> path: {directory} is not on this runner, which has the repository's "
            "files and the hf: checkpoints ci/edgebuild.sh --download fetches; give the checkpoint as hf: ORG/NAME, "
            f"commit it into the repository, or put it at {directory} in a workflow step before the check"
        )
    return absent


def _merge_locks(locks: list[Path]) -> int:
    """The lock files CI shards wrote, merged into the manifest's lock file; 1 when it then
    differs from the one committed at ``HEAD`` (costs aside): frozen runs pull by that one."""
    from edgebuild.core.config import Settings
    from edgebuild.core.files import LOCK_BYTES
    from edgebuild.core.lock_format import parse_lock, read_lock, render_lock
    from edgebuild.core.manifest import manifest_path
    from edgebuild.run.lockfile import lock_change_described, lock_changes, merge_shard_locks, rebuilt_with_other_bytes
    from edgebuild.run.vcs import committed_bytes
    from edgebuild.core.atomic import write_text

    lock_path = manifest_path(Settings.from_environ().manifest).absolute().with_suffix(".lock")
    name = lock_path.name
    committed_text = committed_bytes(lock_path, LOCK_BYTES)
    committed = parse_lock(committed_text, f"{name} at HEAD") if committed_text is not None else {}
    merged = merge_shard_locks(committed, [read_lock(path) for path in locks])
    try:
        write_text(lock_path, render_lock(merged))
    except OSError as error:
        raise EdgebuildError(f"{lock_path}: cannot write the merged lock file: {error.strerror or error}") from None
    changed = lock_changes(committed, merged)
    shards = f"{len(locks)} shard{'' if len(locks) == 1 else 's'}' lock files merged into {name}"
    if committed_text is None:
        print(f"edgebuild: error: {name} is not committed; {shards}: commit it (frozen runs pull by it)", file=sys.stderr)
        return 1
    if changed:
        listed = ", ".join(lock_change_described(committed, merged, artifact) for artifact in changed[:5]) \
            + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        if any(rebuilt_with_other_bytes(committed.get(artifact), merged.get(artifact)) for artifact in changed):
            # Building again wrote other bytes: a doit verify elsewhere would too, so only
            # the bytes this run built (and its lock file names) can be committed.
            advice = ("commit it (frozen runs pull by it): a build of the same fingerprint wrote other bytes than the "
                      "committed lock names, so a doit verify elsewhere would not write this run's")
        else:
            advice = "commit it (frozen runs pull by it), or run doit verify and commit what it writes"
        print(f"edgebuild: error: {name} at HEAD is stale for {listed}; {shards}: {advice}", file=sys.stderr)
        return 1
    print(f"{shards}: as committed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
