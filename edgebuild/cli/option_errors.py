"""What is wrong with a doit command line's options, as the one line the command ends
with (doit's own message lists every option object it knows, or runs a value it cannot
use): an unknown option, a value missing or of the wrong kind, and ``doit OPTIONS
COMMAND``, where doit takes the options for its own ``run``'s."""

from __future__ import annotations

import difflib
import os
import re
from typing import Any, Callable


# doit's options whose type lets through values doit then misuses: any -P but 'thread' is
# taken for 'process' without a word, and -n -3 or -v 9 run as if they meant something.
_VALUES_DOIT_MISTAKES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "par_type": (lambda value: value in ("process", "thread"), "process or thread"),
    # A process each: a machine forks hundreds, never billions (a typo's -n 99999999999).
    "num_process": (lambda value: 0 <= value <= 1024, "a number of processes from 0 to 1024"),
    "verbosity": (lambda value: value in (0, 1, 2), "0, 1 or 2"),
    "failure_verbosity": (lambda value: value in (0, 1, 2), "0, 1 or 2"),
}


def permuted(parser: Any, args: list[str]) -> tuple[list[str], list[str], list[str]] | None:
    """``args`` read by ``getopt.gnu_getopt`` with doit's ``CmdParse`` ``parser``'s options,
    wherever they are up to ``--``: (the options, each with its value; the other
    arguments; ``--`` and what follows it). ``None`` for arguments it refuses."""
    import getopt

    end = args.index("--") if "--" in args else len(args)
    shorts, longs = parser.get_short(), parser.get_long()
    try:
        found, names = getopt.gnu_getopt(args[:end], shorts, longs)
    except getopt.GetoptError:
        return None
    options: list[str] = []
    for flag, value in found:
        if flag.startswith("--"):
            options.append(f"{flag}={value}" if f"{flag[2:]}=" in longs else flag)
        else:
            options += [flag, value] if f"{flag[1]}:" in shorts else [flag]
    return options, names, args[end:]


def option_problem(parser: Any, args: list[str], command: str, anywhere: bool = False) -> str | None:
    """What is wrong with the options in ``args`` for doit's ``CmdParse`` ``parser`` (an
    unknown one, a value missing or given where none is taken, a value of the wrong type
    or not among the choices), as the one line ``command`` ends with; ``None`` when
    nothing is. (doit's own message lists every option object it knows.) ``anywhere``:
    the command takes options among its names too (read as :func:`permuted` reads them)."""
    import getopt

    from doit.cmdparse import CmdParseError

    read = getopt.gnu_getopt if anywhere else getopt.getopt
    end = args.index("--") if anywhere and "--" in args else len(args)
    try:
        found, rest = read(args[:end], parser.get_short(), parser.get_long())
    except getopt.GetoptError as error:
        long_flag = len(error.opt) > 1 or any(arg.split("=", 1)[0] == f"--{error.opt}" for arg in args)
        flag = f"--{error.opt}" if long_flag else f"-{error.opt}"
        if "not recognized" in error.msg:
            return _unknown_option(parser, flag, command)
        if "requires argument" in error.msg:
            return _needs_value(parser, flag)
        if "must not have an argument" in error.msg:
            given = next((arg for arg in args if arg.startswith(flag + "=")), flag)
            return f"{flag} takes no value, found {given!r}"
        if "not a unique prefix" in error.msg:
            return f"{flag} is the start of more than one option of doit {command}; `doit help {command}` lists them"
        return f"{flag}: {error.msg}"
    for flag, value in found:
        option, _ = parser.get_option(flag)
        if option is None or option.type in (bool, list):
            continue
        names = "/".join(name for name in (f"-{option.short}" if option.short else "",
                                           f"--{option.long}" if option.long else "") if name)
        try:
            typed = option.str2type(value)
        except CmdParseError:
            if option.choices:
                return f"{names}: expected one of {', '.join(option.choices)}, found {value!r}"
            expected = {int: "an integer", float: "a number"}.get(option.type, f"a {option.type.__name__}")
            return f"{names}: expected {expected}, found {value!r}"
        if option.name in _VALUES_DOIT_MISTAKES and not _VALUES_DOIT_MISTAKES[option.name][0](typed):
            return f"{names}: expected {_VALUES_DOIT_MISTAKES[option.name][1]}, found {value!r}"
    # Options after the names of a command that reads them only before: one among them is unknown.
    for arg in rest if not anywhere else ():
        if arg == "--":
            break
        if arg.startswith("-") and arg != "-":
            flag = arg.split("=", 1)[0]
            option, _ = parser.get_option(flag)
            if option is not None and option.type is not bool and arg == flag:
                return _needs_value(parser, flag)
            return _unknown_option(parser, flag, command)
    return None


def options_before_the_command(argv: list[str]) -> str | None:
    """The one line for ``doit OPTIONS COMMAND ...`` (``argv``: the process's), ``None``
    when there is nothing to say. doit takes the options before a command's name (but
    ``-f``, ``-d``, ``-k``) as its own ``run`` command's and the name as a task, then ran
    ``-P bogus`` as 'process' or ended in several lines of its own; here a value ``run``
    cannot use is named as any command's option is, and a command's name after them says
    where they go. Checked as the dodo file loads, the first moment edgebuild has."""
    import getopt

    from doit.cmd_base import DoitCmdBase, DodoTaskLoader
    from doit.cmd_run import Run
    from doit.cmdparse import CmdOption, CmdParse, CmdParseError
    from doit.doit_cmd import DoitMain

    if os.path.basename(argv[0]) != "doit":
        return None
    try:
        _, args = CmdParse([CmdOption(option) for option in DodoTaskLoader.cmd_options]).parse_only(argv[1:])
    except CmdParseError:
        args = argv[1:]
    # What doit_cmd also sets aside: NAME=VALUE variables.
    args = [arg for arg in args if arg.startswith("-") or "=" not in arg]
    if not args or not args[0].startswith("-"):
        return None  # a command, or doit run's task names
    parser = CmdParse([CmdOption(option) for option in (*DoitCmdBase.base_options, *DodoTaskLoader.cmd_options,
                                                        *Run.cmd_options)])
    try:
        _, rest = getopt.getopt(args, parser.get_short(), parser.get_long())
    except getopt.GetoptError:
        return option_problem(parser, args, "run")
    before = args[:len(args) - len(rest)]
    problem = option_problem(parser, before, "run")
    if problem is not None:
        return problem
    from importlib.metadata import entry_points

    commands = {command.name for command in DoitMain.DOIT_CMDS} | {point.name for point in entry_points(group="doit.COMMAND")}
    if rest and rest[0] in commands:
        options = " ".join(before)
        return f"doit's options go after the command's name: doit {rest[0]} {options}, not doit {options} {rest[0]}"
    return None


def _needs_value(parser: Any, flag: str) -> str:
    option, _ = parser.get_option(flag)
    # doit's help strings end "[default: %(default)s]", for its own help to fill in;
    # the default that applies may be the project's (DOIT_CONFIG), so none is named here.
    text = re.sub(r"\s*\[default: %\(default\)s\]", "", option.help.splitlines()[0]) if option is not None and option.help else ""
    what = f": {text}" if text else ""
    return f"{flag} needs a value{what}"


def _unknown_option(parser: Any, flag: str, command: str) -> str:
    """The line for ``flag``, which ``command`` does not take: the other edgebuild commands
    that take it, or the option of ``command`` it may be a typo of."""
    elsewhere = [name for name, options in _edgebuild_command_options().items()
                 if name != command and flag.startswith("--") and flag[2:] in options]
    if elsewhere:
        hint = f" (it is an option of {' and '.join(f'doit {name}' for name in elsewhere)})"
    else:
        known = [f"--{option.long}" for option in parser.options if option.long]
        known += [f"--{option.inverse}" for option in parser.options if option.inverse]
        match = difflib.get_close_matches(flag, known, n=1, cutoff=0.75)
        hint = f" (did you mean {match[0]}?)" if match else ""
    return f"doit {command} has no option {flag}{hint}; `doit help {command}` lists its options"


def _edgebuild_command_options() -> dict[str, set[str]]:
    """edgebuild's doit commands (its ``doit.COMMAND`` entry points) and the long names of
    the options each adds to doit's; loaded only to word an error."""
    from importlib import metadata

    commands: dict[str, set[str]] = {}
    for point in metadata.entry_points(group="doit.COMMAND"):
        if not point.value.startswith("edgebuild."):
            continue
        try:
            loaded = point.load()
        except Exception:  # a command that does not load has nothing to suggest
            continue
        commands[point.name] = {option["long"] for option in getattr(loaded, "cmd_options", ()) if option.get("long")}
    return dict(sorted(commands.items()))
