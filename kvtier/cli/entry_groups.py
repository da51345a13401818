"""A click group that also holds the commands other distributions add through entry points.

kvtier imports nothing of kvtier-tools: the tools join `kvtier` (group `kvtier.commands`) and
`kvtier fleet` (group `kvtier.fleet.commands`) through their distribution's entry points, and
a name only the tools provide says in one line where it is when they are absent.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

import click

from kvtier.errors import KvtierError

TOOLS_INSTALL = "pip install -e tools/ in a kvtier checkout (scripts/setup.sh does it)"


def installed_commands(group: str) -> dict[str, EntryPoint]:
    """The installed distributions' entry points of `group`, by name."""
    return {entry.name: entry for entry in entry_points(group=group)}


class EntryPointGroup(click.Group):
    """A group's own commands, then those of the entry-point group `entry_group`
    (`installed`); `tool_commands` are the names kvtier-tools adds, named only to say where
    they are. `prefix` is the command line before a subcommand's name, for messages."""

    entry_group = ""
    tool_commands: tuple[str, ...] = ()
    prefix = "kvtier"

    def installed(self) -> dict[str, EntryPoint]:
        """This group's installed entry points, by name."""
        return installed_commands(self.entry_group)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.installed()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        entry = self.installed().get(cmd_name)
        if entry is None:
            if cmd_name in self.tool_commands:
                raise KvtierError(
                    f"`{self.prefix} {cmd_name}` is part of kvtier-tools, which is not "
                    f"installed: {TOOLS_INSTALL}"
                )
            return None
        loaded = entry.load()
        if not isinstance(loaded, click.Command):
            raise KvtierError(
                f"entry point {cmd_name} = {entry.value} ({self.entry_group}) "
                "is not a click command"
            )
        self.add_command(loaded, cmd_name)
        return loaded
