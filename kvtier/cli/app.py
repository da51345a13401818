"""The `kvtier` command line.

Every command turns a kvtier error into one line on stderr and a non-zero exit status, never
a traceback. Progress bars appear only when stderr is a terminal.

The product's own commands are here (`kvtier check`, `kvtier migrate`, `kvtier keys`,
`kvtier fleet index`).
The tooling's commands (`kvtier replay`, `simulate`, `bench`, `demo`, `workloads`, `fleet
simulate`) come with the kvtier-tools distribution (tools/ in the repository), which adds them
through the `kvtier.commands` entry-point group (and `kvtier.fleet.commands`): kvtier imports
nothing of it, and without it those names say in one line where they are.
"""

from __future__ import annotations

import functools
import sys
from importlib.metadata import EntryPoint
from typing import Any

import click

from kvtier.cli.console import err
from kvtier.cli.entry_groups import EntryPointGroup, installed_commands
from kvtier.compiled import core_status
from kvtier.errors import KvtierError

EXIT_USAGE = 2

COMMANDS_GROUP = "kvtier.commands"
"""The entry-point group through which another distribution adds a command to `kvtier`."""

TOOL_COMMANDS = ("bench", "demo", "replay", "simulate", "workloads")
"""The commands kvtier-tools adds, named here only to say where they are when it is absent."""


@functools.cache
def command_entry_points() -> dict[str, EntryPoint]:
    """The installed distributions' commands (group `kvtier.commands`), by name."""
    return installed_commands(COMMANDS_GROUP)


class _KvtierGroup(EntryPointGroup):
    """Turns KvtierError and click's usage errors into one clear line and exit status 2, and
    finds the commands other distributions add through their entry points."""

    entry_group = COMMANDS_GROUP
    tool_commands = TOOL_COMMANDS

    def installed(self) -> dict[str, EntryPoint]:
        return command_entry_points()

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KvtierError as exc:
            err.print(f"kvtier: error: {exc}", markup=False)
            sys.exit(EXIT_USAGE)
        except click.UsageError as exc:  # a bad option of any command: one line too
            where = exc.ctx.command_path if exc.ctx is not None else "kvtier"
            err.print(f"kvtier: error: {exc.format_message()} (see {where} --help)", markup=False)
            sys.exit(EXIT_USAGE)
        except KeyboardInterrupt:
            err.print("kvtier: interrupted", markup=False)
            sys.exit(130)


@click.group(cls=_KvtierGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    package_name="kvtier",
    # which bookkeeping runs: the compiled core (scripts/build-core) or its .py source
    message="%(prog)s, version %(version)s\nbookkeeping: " + core_status().replace("%", "%%"),
)
def main() -> None:
    """kvtier: keep the KV cache of LLM serving engines in a chain of tiers (GPU, pinned CPU,
    disk, and stores a fleet shares: Redis, a shared filesystem)."""


from kvtier.cli.commands.check import check  # noqa: E402
from kvtier.cli.commands.fleet import fleet  # noqa: E402
from kvtier.cli.commands.keys import keys  # noqa: E402
from kvtier.cli.commands.migrate import migrate  # noqa: E402

main.add_command(check)
main.add_command(fleet)
main.add_command(keys)
main.add_command(migrate)


if __name__ == "__main__":  # pragma: no cover
    main()
