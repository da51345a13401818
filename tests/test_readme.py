"""The README's Python examples run as written, and its commands exist."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
EXAMPLES = re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)


def test_readme_has_python_examples() -> None:
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("source", EXAMPLES, ids=[f"example{i}" for i in range(len(EXAMPLES))])
def test_readme_example_runs(source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    exec(compile(source, "README.md", "exec"), {})


def test_readme_starts_with_the_two_commands() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README, flags=re.DOTALL)
    assert first_block is not None and README.index("```bash") < README.index("\n## ")
    commands = [line.split("#")[0].split() for line in first_block.group(1).splitlines()]
    assert [c[0] for c in commands if c] == ["scripts/kvtier", "scripts/test"]
    for command in commands:
        if command:
            assert os.access(ROOT / command[0], os.X_OK)


# -- every command, option and path the README names exists ---------------------------------

FOREIGN_OPTIONS = {"--no-deps": "pip", "--kv-transfer-config": "vllm serve"}
"""Options the README names that belong to other programs (only outside a kvtier command's
section)."""

REPO_DIRS = (
    "configs/",
    "docs/",
    "examples/",
    "kvtier/",
    "scripts/",
    "tests/",
    "tools/",
    ".ci/",
)
"""A backticked span starting with one of these names a file of the repository."""

_SHELL_END = {">", ">>", "|", "||", "&&", ";", "&", "#"}


def _command_options(command: click.Command) -> set[str]:
    context = click.Context(command, info_name=command.name)
    return {
        name
        for param in command.get_params(context)
        if isinstance(param, click.Option)
        for name in (*param.opts, *param.secondary_opts)
    }


def _code(readme: str) -> tuple[list[tuple[str, str | None]], list[tuple[str, str | None]]]:
    """The README's command lines and inline code spans, each with the kvtier command whose
    section it is in (None outside one): ([(line, section)], [(span, section)]).

    Command lines are the lines of ```bash blocks, `$ `-prompted lines of plain ``` blocks
    (sample outputs) and the lines of indented blocks; other fenced blocks (Python, JSON,
    TOML) are not commands. A section is a `## ` heading (the main job's is `kvtier replay`),
    or a `### ` heading naming `kvtier <command>`; other `### ` headings keep their parent's.
    """
    lines: list[tuple[str, str | None]] = []
    spans: list[tuple[str, str | None]] = []
    section: str | None = None
    fence: str | None = None
    for line in readme.splitlines():
        if fence is not None:
            if line.startswith("```"):
                fence = None
            elif fence == "bash":
                lines.append((line, section))
            elif fence == "" and line.startswith("$ "):
                lines.append((line[2:], section))
            continue
        if line.startswith("```"):
            fence = line[3:].strip()
            continue
        if line.startswith(("## ", "### ")):
            named = re.search(r"`kvtier ([a-z][\w-]*)`", line)
            if named:
                section = named.group(1)
            elif line.startswith("## "):
                section = "replay" if "main job" in line else None
        if line.startswith("    ") and line.strip():
            lines.append((line.strip(), section))
            continue
        spans += [(span, section) for span in re.findall(r"`([^`\n]+)`", line)]
    return lines, spans


def _invocations(text: str) -> list[list[str]]:
    """The `kvtier ...` / `scripts/kvtier ...` invocations in `text`, as their words after
    `kvtier`, up to a shell operator or a comment."""
    found = []
    for match in re.finditer(r"(?:^|[\s$(])(?:\S*/)?kvtier((?:[ \t]+\S+)+)", text):
        words: list[str] = []
        for word in match.group(1).split():
            if word in _SHELL_END or word.startswith("#"):
                break
            words.append(word)
        if words:
            found.append(words)
    return found


def _built(path: str) -> bool:
    """Whether `path` is a build output that `.gitignore` names (`kvtier/_compiled/`): it
    exists only where the set-up has run, not in a bare clone."""
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    return "/" + path in ignored


def _resolves(dotted: str) -> bool:
    """Whether `dotted` (`kvtier.x.y`, a module and then attributes) names something that
    exists. A module whose import needs a package that is not installed (vLLM) counts as
    existing when its file does."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        module = ".".join(parts[:split])
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            continue
        if split == len(parts):
            return True
        try:
            value: object = importlib.import_module(module)
        except ModuleNotFoundError as error:
            return not (error.name or "").startswith("kvtier")
        for name in parts[split:]:
            if not hasattr(value, name):
                return False
            value = getattr(value, name)
        return True
    return False


def readme_problems(readme: str) -> list[str]:
    """Every kvtier subcommand, option, repository path and `kvtier.` (or `kvtier_tools.`)
    dotted name `readme` names that does not exist, one line each (empty: all exist)."""
    from kvtier.cli.app import main as cli

    context = click.Context(cli)
    for name in cli.list_commands(context):  # kvtier-tools' commands join through entry points
        cli.get_command(context, name)
    every_option = set(_command_options(cli))
    for command in cli.commands.values():
        every_option |= _command_options(command)
    problems: list[str] = []
    lines, spans = _code(readme)
    for line, _ in lines:
        for words in _invocations(line):
            problems += _invocation_problems(cli, words, f"`{line.strip()}`")
    for span, section in spans:
        problems += _span_problems(cli, span, section, every_option)
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme):
        if "://" not in target and not (ROOT / target).exists():
            problems.append(f"link ({target}): no such path in the repository")
    return problems


def _invocation_problems(cli: click.Group, words: list[str], where: str) -> list[str]:
    """The unknown subcommand, or the unknown options, of one `kvtier` invocation (its words
    after `kvtier`)."""
    problems: list[str] = []
    command: click.Command = cli
    path = ["kvtier"]
    for word in words:
        if isinstance(command, click.Group) and not word.startswith("-"):
            sub = command.commands.get(word)
            if sub is None:
                problems.append(f"{where}: unknown command {' '.join(path)} {word}")
                return problems
            command = sub
            path.append(word)
        elif re.fullmatch(r"--?[A-Za-z][\w-]*(=.*)?", word):
            option = word.split("=", 1)[0]
            if option not in _command_options(command):
                problems.append(f"{where}: unknown option {option} of {' '.join(path)}")
    return problems


def _span_problems(
    cli: click.Group, span: str, section: str | None, every_option: set[str]
) -> list[str]:
    """What one inline code span names that does not exist: a kvtier invocation's command or
    options, an option of its section's command (of any kvtier command outside one), a
    repository path, a `kvtier.` dotted name."""
    problems: list[str] = []
    words = span.split()
    if re.match(r"(?:\S*/)?kvtier(?:\s|$)", span):
        for invocation in _invocations(" " + span):
            problems += _invocation_problems(cli, invocation, f"`{span}`")
    elif re.fullmatch(r"--[A-Za-z][\w-]*(=.*)?", words[0]):
        option = words[0].split("=", 1)[0]
        if section is not None:
            if option not in _command_options(cli.commands[section]):
                problems.append(f"`{span}`: unknown option {option} of kvtier {section}")
        elif option not in every_option and option not in FOREIGN_OPTIONS:
            problems.append(f"`{span}`: no kvtier command has {option}")
    path = words[0]
    if path.startswith(REPO_DIRS) and not any(ROOT.glob(path.rstrip("/"))) and not _built(path):
        problems.append(f"`{span}`: no such path {path} in the repository")
    dotted = re.match(r"kvtier(?:_tools)?(?:\.[A-Za-z_]\w*)+", span)
    if dotted and not _resolves(dotted.group(0).rstrip(".")):
        problems.append(f"`{span}`: no such module or name {dotted.group(0)}")
    return problems


def test_every_command_option_and_path_the_readme_names_exists() -> None:
    assert readme_problems(README) == []


def test_the_readme_checks_see_what_the_readme_names() -> None:
    lines, spans = _code(README)
    texts = [line for line, _ in lines] + [" " + span for span, _ in spans]
    named = {words[0] for text in texts for words in _invocations(text)}
    assert {"replay", "simulate", "bench", "check", "demo"} <= named
    sections = {section for _, section in spans if section is not None}
    assert {"replay", "simulate", "bench", "check"} <= sections


@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        ("kvtier simulate --policy lru --capacity", "kvtier simulate --polcy lru --capacity",
         "unknown option --polcy of kvtier simulate"),
        ("    kvtier bench --quick", "    kvtier benchmark --quick",
         "unknown command kvtier benchmark"),
        ("scripts/kvtier replay   #", "scripts/kvtier replay --fast  #",
         "unknown option --fast of kvtier replay"),
        ("`kvtier simulate --config`", "`kvtier simulate --conf`",
         "unknown option --conf of kvtier simulate"),
        ("`kvtier replay --metrics-port 9400`", "`kvtier replay --metric-port 9400`",
         "unknown option --metric-port of kvtier replay"),
        ("`kvtier check OUT/disk/<tier>`", "`kvtier fsck OUT/disk/<tier>`",
         "unknown command kvtier fsck"),
        ("`--repair` drops", "`--fix` drops", "unknown option --fix of kvtier check"),
        ("`--dir` to choose", "`--directory` to choose",
         "unknown option --directory of kvtier bench"),
        ("$ kvtier bench --write-path", "$ kvtier bench --write-paths",
         "unknown option --write-paths of kvtier bench"),
        ("`configs/default.toml`", "`configs/defaults.toml`", "no such path configs/defaults.toml"),
        ("`tools/kvtier_tools/bench/vllm_tiers.py`", "`tools/kvtier_tools/bench/vllm_tier.py`",
         "no such path tools/kvtier_tools/bench/vllm_tier.py"),
        ("`tests/test_vllm_*.py`", "`tests/test_vllm2_*.py`", "no such path tests/test_vllm2_*.py"),
        ("`--skip-partial-blocks` stores", "`--skip-partials` stores",
         "unknown option --skip-partials of kvtier simulate"),
        ("with `--no-deps`", "with `--no-dependencies`", "no kvtier command has --no-dependencies"),
        ("`tools/kvtier_tools/workloads/data/NOTICE.md`", "`kvtier/data/NOTICE.md`",
         "no such path kvtier/data/NOTICE.md"),
        ("(docs/ARCHITECTURE.md)", "(ARCHITECTURE.md)", "link (ARCHITECTURE.md)"),
        # A build output (git-ignored, absent from a bare clone) counts; a misspelt one not.
        ("`kvtier/_compiled/` (git-ignored)", "`kvtier/_compile/` (git-ignored)",
         "no such path kvtier/_compile/"),
        ("`kvtier_tools.workloads.traces.read_mooncake()`", "`kvtier.traces.read_mooncake()`",
         "no such module or name kvtier.traces.read_mooncake"),
        ("`kvtier.tiers.registry.register_tier`", "`kvtier.tiers.registry.register`",
         "no such module or name kvtier.tiers.registry.register"),
    ],
)  # fmt: skip
def test_the_readme_check_fails_on_what_does_not_exist(old: str, new: str, named: str) -> None:
    assert old in README
    problems = readme_problems(README.replace(old, new, 1))
    assert any(named in problem for problem in problems), problems
