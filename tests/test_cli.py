"""The `kvtier` command line: happy paths and one-line errors."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console
from rich.table import Table

from kvtier.cli import main
from kvtier.cli.console import UNCUT_WIDTH, decimal_unit, format_bytes, make_console


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.slow
def test_demo_on_the_default_config_prints_chain_replay_and_policies() -> None:
    code, stdout, stderr = run("demo", "--limit", "300")
    assert code == 0, stderr
    assert "Tier chain (embedded default)" in stdout
    assert "cpu" in stdout and "disk" in stdout
    assert "300 requests" in stdout
    assert "Each active tier alone" in stdout
    assert "Policy hit ratios" in stdout
    assert "Traceback" not in stdout + stderr


def test_demo_with_a_config_file_and_a_trace_file(tmp_path: Path) -> None:
    config = tmp_path / "chain.toml"
    config.write_text(
        'block_size = 4096\n[[tiers]]\nname = "small"\nmedium = "cpu"\ncapacity = 4\n'
        'policy = "lru"\n'
    )
    trace = tmp_path / "trace.jsonl"
    lines = [
        {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]},
        {"timestamp": 1, "input_length": 1536, "output_length": 1, "hash_ids": [1, 2, 3]},
    ]
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, stdout, stderr = run("demo", "--config", str(config), "--trace", str(trace))
    assert code == 0, stderr
    assert "small" in stdout and "2 requests, 5 block accesses, 3 unique blocks" in stdout
    # Request 2 finds blocks 1 and 2 stored by request 1: 2 prefix hits of 5 accesses.
    assert "0.4000" in stdout


def test_bad_config_is_one_line_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(
        'block_size = 4096\n[[tiers]]\nname = "c"\nmedium = "cpu"\ncapacity = "lots"\n'
    )
    code, _, stderr = run("demo", "--config", str(config))
    assert code == 2
    assert "tiers[0].capacity" in stderr and '"lots"' in stderr
    assert "Traceback" not in stderr


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    code, _, stderr = run("demo", "--config", str(tmp_path / "nope.toml"))
    assert code == 2
    assert "nope.toml" in stderr and stderr.startswith("kvtier: error:")


def test_malformed_trace_names_the_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n{oops\n'
    )
    code, _, stderr = run("demo", "--trace", str(trace))
    assert code == 2
    assert "t.jsonl:2" in stderr


def test_help_lists_commands_and_examples() -> None:
    code, stdout, _ = run("--help")
    assert code == 0 and "demo" in stdout
    code, stdout, _ = run("demo", "--help")
    assert code == 0 and "Examples:" in stdout and "--limit" in stdout


def test_a_bad_option_of_any_command_is_one_line() -> None:
    for args, fragment in (
        (("demo", "--limit", "0"), "--limit"),
        (("simulate", "--limit", "x"), "--limit"),
        (("replay", "--bogus"), "--bogus"),
        (("nosuch",), "No such command"),
    ):
        code, stdout, stderr = run(*args)
        assert code == 2, args
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kvtier: error:"), (args, stderr)
        assert fragment in lines[0] and "--help" in lines[0]
        assert "Traceback" not in stdout + stderr


def test_every_command_has_help_with_examples() -> None:
    for command in ("replay", "simulate", "bench", "check", "demo"):
        code, stdout, _ = run(command, "--help")
        assert code == 0 and "Examples" in stdout, command


# -- output that is not a terminal ---------------------------------------------------------------


def wide_table() -> tuple[Table, list[str]]:
    """A table of 12 columns of long figures: some 250 columns wide."""
    table = Table(title="a wide table")
    cells = [f"{index:,}{'9' * 12}.{index:04d}" for index in range(12)]
    for index in range(12):
        table.add_column(f"figure number {index}", justify="right")
    table.add_row(*cells)
    return table, cells


def test_tables_are_not_cut_when_output_is_not_a_terminal() -> None:
    table, cells = wide_table()
    piped = io.StringIO()
    make_console(piped).print(table)
    text = piped.getvalue()
    assert "…" not in text
    assert all(cell in text for cell in cells)
    assert all(f"figure number {index}" in text for index in range(12))
    assert max(len(line) for line in text.splitlines()) > 200  # one row, not wrapped
    # what a plain rich console does with the same table when not on a terminal (80 columns)
    squeezed = io.StringIO()
    Console(file=squeezed).print(table)
    assert "…" in squeezed.getvalue() or not all(c in squeezed.getvalue() for c in cells)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_keeps_its_own_width() -> None:
    assert make_console(Terminal()).width < UNCUT_WIDTH
    assert make_console(io.StringIO()).width == UNCUT_WIDTH


def test_byte_totals_are_in_the_decimal_units_of_gb_per_s() -> None:
    assert format_bytes(3_030_000_000) == "3.03 GB"
    assert format_bytes(782_000_000) == "782.0 MB"
    assert format_bytes(512) == "512 B"
    assert decimal_unit(2.5e12) == (1e12, "TB") and decimal_unit(10) == (1.0, "B")


# -- the tools' commands join `kvtier` through the `kvtier.commands` entry points -------------


def _entry_points(monkeypatch: pytest.MonkeyPatch, **points: str) -> None:
    """Make `kvtier` see exactly these entry points (name -> "module:attr"), none loaded."""
    from importlib.metadata import EntryPoint

    from kvtier.cli import app

    found = {name: EntryPoint(name, value, app.COMMANDS_GROUP) for name, value in points.items()}
    monkeypatch.setattr(app, "command_entry_points", lambda: found)
    for name in (*app.TOOL_COMMANDS, *points):
        if name not in ("check", "keys"):
            monkeypatch.delitem(main.commands, name, raising=False)


def test_a_tool_command_without_kvtier_tools_says_where_it_is_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _entry_points(monkeypatch)
    code, stdout, stderr = run("replay", "--limit", "3")
    assert code == 2
    assert stdout == ""
    assert stderr.strip() == (
        "kvtier: error: `kvtier replay` is part of kvtier-tools, which is not installed: "
        "pip install -e tools/ in a kvtier checkout (scripts/setup.sh does it)"
    )
    code, stdout, _ = run("--help")
    assert code == 0
    assert "check" in stdout and "replay" not in stdout


def test_a_command_of_another_distribution_joins_through_its_entry_point(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _entry_points(monkeypatch, signing="kvtier.cli.commands.keys:keys")
    code, stdout, stderr = run("--help")
    assert code == 0, stderr
    assert "signing" in stdout
    code, stdout, stderr = run("signing", "--help")
    assert code == 0, stderr
    assert stdout.startswith("Usage: main signing [OPTIONS] COMMAND")  # the keys group's
    assert "kvtier keys new" in stdout


def test_an_entry_point_that_is_not_a_command_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _entry_points(monkeypatch, broken="kvtier.cli.app:TOOL_COMMANDS")
    code, _, stderr = run("broken")
    assert code == 2
    assert stderr.strip() == (
        "kvtier: error: entry point broken = kvtier.cli.app:TOOL_COMMANDS (kvtier.commands) "
        "is not a click command"
    )


def test_kvtier_fleet_finds_its_tool_commands_by_their_own_entry_points(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`kvtier fleet` loads `kvtier.fleet.commands`: without kvtier-tools `fleet simulate`
    says where it is in one line; another distribution's command joins the group."""
    from importlib.metadata import EntryPoint

    from kvtier.cli.commands.fleet import FLEET_COMMANDS_GROUP, fleet

    monkeypatch.setattr(fleet, "commands", {"index": fleet.commands["index"]})
    monkeypatch.setattr(type(fleet), "installed", lambda self: {})
    code, stdout, stderr = run("fleet", "simulate")
    assert code == 2 and stdout == ""
    assert stderr.strip() == (
        "kvtier: error: `kvtier fleet simulate` is part of kvtier-tools, which is not "
        "installed: pip install -e tools/ in a kvtier checkout (scripts/setup.sh does it)"
    )
    found = {"audit": EntryPoint("audit", "kvtier.cli.commands.keys:keys", FLEET_COMMANDS_GROUP)}
    monkeypatch.setattr(type(fleet), "installed", lambda self: found)
    code, stdout, stderr = run("fleet", "--help")
    assert code == 0, stderr
    assert "audit" in stdout and "index" in stdout


def test_the_tools_commands_are_installed_beside_the_product() -> None:
    """The set-up installs kvtier-tools, whose entry points name the tool commands."""
    from kvtier.cli import app

    app.command_entry_points.cache_clear()
    assert set(app.command_entry_points()) >= set(app.TOOL_COMMANDS)
