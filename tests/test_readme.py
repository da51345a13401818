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

FOREIGN_OPTIONS = {
    "--no-deps": "pip",
    "--kv-transfer-config": "vllm serve",
    "--kv-cache-memory-bytes": "vllm serve",
    "--shutdown-timeout": "vllm serve",
}
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
    or a `### ` heading naming `kvtier <command>` (a subcommand's words too: `fleet
    simulate`); other `### ` headings keep their parent's.
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
            named = re.search(r"`kvtier ([a-z][\w-]*(?: [a-z][\w-]*)*)`", line)
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

    _load_commands(cli)  # kvtier-tools' commands join through entry points
    every_option = _options_at_any_depth(cli)
    problems: list[str] = []
    lines, spans = _code(readme)
    for line, _ in lines:
        for words in _invocations(line):
            problems += _invocation_problems(cli, words, f"`{line.strip()}`")
        problems += _script_problems(line)
    for span, section in spans:
        problems += _span_problems(cli, span, section, every_option)
        problems += _script_problems(span)
    problems += command_problems(readme)
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


def _load_commands(group: click.Group) -> None:
    """Load every command of `group` and of its groups, at any depth (a group may find its
    commands through entry points only when asked: `kvtier fleet simulate`)."""
    context = click.Context(group)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        if isinstance(command, click.Group):
            _load_commands(command)


def _options_at_any_depth(group: click.Group) -> set[str]:
    """The options of `group` and of every command below it (`kvtier fleet index`'s too)."""
    options = set(_command_options(group))
    for command in group.commands.values():
        if isinstance(command, click.Group):
            options |= _options_at_any_depth(command)
        else:
            options |= _command_options(command)
    return options


def _section_command(cli: click.Group, section: str) -> click.Command:
    """The command a section names (`fleet simulate`: the group's subcommand)."""
    command: click.Command = cli
    for word in section.split():
        assert isinstance(command, click.Group), section
        command = command.commands[word]
    return command


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
            if option not in _command_options(_section_command(cli, section)):
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


# -- every file, module and script a command of README.md or docs/ names exists -------------

DOCS = {path: path.read_text() for path in sorted((ROOT / "docs").glob("*.md"))}
"""docs/*.md, checked for what their commands name (their option spans belong to the
benchmarks' modules, whose options `test_every_module_option_the_docs_name_is_in_its_help`
checks where a command line names them)."""

FILE_SUFFIXES = (".py", ".pyx", ".pyi", ".toml", ".sh", ".md", ".json", ".jsonl", ".zst", ".txt")
"""A word with a "/" ending in one of these names a file (of the repository, unless it is
one of NOT_SHIPPED)."""

NOT_SHIPPED = (".venv", "kvtier-out/", "OUT/", "out/", "FAST25-release/")
"""What the set-up and the commands make (environments, outputs), and the paths of other
repositories (Mooncake's traces): not in a clone."""


def _command_texts(text: str) -> list[str]:
    """The command lines and inline code spans of a Markdown text (see `_code`)."""
    lines, spans = _code(text)
    return [line for line, _ in lines] + [span for span, _ in spans]


def _until_shell_end(words: list[str]) -> list[str]:
    """`words` up to a shell operator or a comment."""
    kept: list[str] = []
    for word in words:
        if word in _SHELL_END or word.startswith("#"):
            break
        kept.append(word)
    return kept


def _file_problems(text: str) -> list[str]:
    """The repository files named in one command or span that do not exist."""
    problems: list[str] = []
    for raw in text.split("#", 1)[0].split():  # every command of a pipeline or `&&` list
        word = raw.strip("'\"`(),;:").split("#", 1)[0]
        if (
            "/" not in word
            or "://" in word
            or word.startswith(("/", "~", "-", *NOT_SHIPPED))
            or any(char in word for char in "<>${}=")
            or not (word.endswith(FILE_SUFFIXES) or word.startswith(REPO_DIRS))
        ):
            continue
        # docs/ARCHITECTURE.md names the package's modules from inside it (`tiers/disk/...`).
        found = any(ROOT.glob(word.rstrip("/"))) or any((ROOT / "kvtier").glob(word))
        if not found and not _built(word):
            problems.append(f"`{text.strip()}`: no such path {word} in the repository")
    return problems


def module_invocations(text: str) -> list[tuple[str, list[str]]]:
    """The `python -m kvtier...` invocations of a Markdown text's commands: (module, the
    options given to it)."""
    found = []
    for command in _command_texts(text):
        for match in re.finditer(r"python3? -m (kvtier[\w.]*)((?:[ \t]+\S+)*)", command):
            module = match.group(1)
            if module.endswith("."):  # `python -m kvtier_tools.bench.<name>`: a pattern
                continue
            words = _until_shell_end(match.group(2).split())
            options = [word.split("=", 1)[0] for word in words if word.startswith("--")]
            found.append((module, options))
    return found


def _script_problems(line: str) -> list[str]:
    """A `scripts/NAME ...` command line: the option it gives must be in the script, and a
    script that dispatches on its first argument (`case "${1:-}" in`) must have a branch
    for the one given. (scripts/kvtier is the CLI: `_invocations` checks it.)"""
    words = _until_shell_end(line.split())
    while words and "=" in words[0] and not words[0].startswith("-"):  # VAR=value
        words = words[1:]
    if not words or not re.fullmatch(r"scripts/[\w.-]+", words[0]) or words[0] == "scripts/kvtier":
        return []
    script = ROOT / words[0]
    if not script.is_file():
        return []  # `_file_problems` names it
    source = script.read_text()
    problems = []
    for position, word in enumerate(words[1:]):
        if word.startswith("--"):
            if re.search(rf"(?<![\w-]){re.escape(word.split('=', 1)[0])}(?![\w-])", source) is None:
                problems.append(f"`{line.strip()}`: {words[0]} has no option {word}")
        elif position == 0 and not word.startswith("-") and 'case "${1:-}" in' in source:
            branch = rf"^\s*(?:[\w-]+\|)*{re.escape(word)}(?:\|[\w-]+)*\)"
            if re.search(branch, source, re.M) is None:
                problems.append(f"`{line.strip()}`: {words[0]} has no command {word}")
    return problems


def command_problems(text: str) -> list[str]:
    """What the commands and spans of a Markdown text name that does not exist: repository
    files, `python -m kvtier...` modules, a script's options and commands."""
    problems: list[str] = []
    for command in _command_texts(text):
        problems += _file_problems(command)
    for module, _ in module_invocations(text):
        if not _resolves(module):
            problems.append(f"`python -m {module}`: no such module")
    return problems


@pytest.mark.parametrize("name", sorted(DOCS), ids=lambda path: path.name)
def test_every_file_module_kvtier_command_and_link_the_docs_name_exists(name: Path) -> None:
    from kvtier.cli.app import main as cli

    text = DOCS[name]
    problems = command_problems(text)
    lines, _ = _code(text)
    for line, _ in lines:
        for words in _invocations(line):
            problems += _invocation_problems(cli, words, f"`{line.strip()}`")
    for command in _command_texts(text):
        problems += _script_problems(command)
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in target and not (name.parent / target).exists():
            problems.append(f"link ({target}): no such path from {name.parent.name}/")
    assert problems == []


def _command_paths(text: str) -> set[tuple[str, ...]]:
    """The kvtier (sub)commands a Markdown text's commands invoke, as word paths."""
    from kvtier.cli.app import main as cli

    paths = set()
    for command in _command_texts(text):
        for words in _invocations(" " + command):
            group: click.Command = cli
            path: list[str] = []
            for word in words:
                if not isinstance(group, click.Group) or word.startswith("-"):
                    break
                sub = group.commands.get(word)
                if sub is None:
                    break
                group = sub
                path.append(word)
            if path:
                paths.add(tuple(path))
    return paths


def test_every_kvtier_command_named_answers_help() -> None:
    """`kvtier X --help` for every command README.md and docs/ name (parses and prints)."""
    from click.testing import CliRunner

    from kvtier.cli.app import main as cli

    named = set().union(*(_command_paths(text) for text in [README, *DOCS.values()]))
    assert {("replay",), ("simulate",), ("check",), ("bench",), ("keys", "new")} <= named
    for path in sorted(named):
        result = CliRunner().invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Usage: " in result.output, (path, result.output)


HELP_OF_MODULES = """
import contextlib, io, json, runpy, sys
helps = {}
for module in sys.argv[1:]:
    sys.argv = [module, "--help"]
    text = io.StringIO()
    try:
        with contextlib.redirect_stdout(text):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as done:
        helps[module] = text.getvalue() if done.code in (0, None) else f"exit {done.code}"
    except ModuleNotFoundError as error:
        helps[module] = None if not (error.name or "").startswith("kvtier") else repr(error)
    else:
        helps[module] = text.getvalue()
print(json.dumps(helps))
"""


def module_option_problems(texts: list[str]) -> list[str]:
    """`python -m kvtier.X --help` of every module the commands of `texts` run, in one
    subprocess: a module whose help fails, or that does not name an option a command gives
    it, is a problem (a module whose import needs a package that is not installed, vLLM,
    is skipped)."""
    import json
    import subprocess
    import sys

    invoked = [pair for text in texts for pair in module_invocations(text)]
    modules = sorted({module for module, _ in invoked})
    run = subprocess.run(
        [sys.executable, "-c", HELP_OF_MODULES, *modules],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=ROOT,
        # this checkout's kvtier and kvtier-tools, whichever checkout the venv was made from
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tools")]),
            "VLLM_TARGET_DEVICE": "cpu",
        },
    )
    assert run.returncode == 0, run.stderr[-2000:]
    helps: dict[str, str | None] = json.loads(run.stdout.splitlines()[-1])
    problems = []
    for module, options in invoked:
        shown = helps[module]
        if shown is None:
            continue
        if "usage:" not in shown:
            problems.append(f"python -m {module} --help: {shown[:200]!r}")
            continue
        problems += [
            f"python -m {module} has no option {option}"
            for option in options
            if re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", shown) is None
        ]
    return problems


@pytest.mark.timeout(300)
def test_every_module_option_the_docs_name_is_in_its_help() -> None:
    """Every `python -m kvtier...` README.md and docs/ run answers --help and has the
    options they give it."""
    texts = [README, *DOCS.values()]
    modules = {module for text in texts for module, _ in module_invocations(text)}
    assert {"kvtier_tools.bench.engine_ttft", "kvtier_tools.bench.policy_traces"} <= modules
    assert module_option_problems(texts) == []


def test_a_module_option_that_does_not_exist_is_named() -> None:
    problems = module_option_problems(
        ["`python -m kvtier_tools.bench.policy_speed --limit 3000 --fraction 0.05`"]
    )
    assert problems == ["python -m kvtier_tools.bench.policy_speed has no option --fraction"]


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
        # A file a command runs, a module run with -m, a script's option or command.
        ("`python -m kvtier_tools.bench.engine_ttft`, the vLLM",
         "`benchmarks/engine_ttft.py`, the vLLM",
         "no such path benchmarks/engine_ttft.py"),
        ("bin/python -m kvtier_tools.bench.engine_ttft`):",
         "bin/python benchmarks/engine_ttft.py`):",
         "no such path benchmarks/engine_ttft.py"),
        ("`python -m kvtier_tools.bench.vllm_tiers`", "`python -m kvtier_tools.bench.vllm_tier`",
         "`python -m kvtier_tools.bench.vllm_tier`: no such module"),
        ("`scripts/setup.sh --engine`: vLLM", "`scripts/setup.sh --engines`: vLLM",
         "scripts/setup.sh has no option --engines"),
        ("`scripts/redis.sh tls` a TLS-only", "`scripts/redis.sh tsl` a TLS-only",
         "scripts/redis.sh has no command tsl"),
    ],
)  # fmt: skip
def test_the_readme_check_fails_on_what_does_not_exist(old: str, new: str, named: str) -> None:
    assert old in README
    problems = readme_problems(README.replace(old, new, 1))
    assert any(named in problem for problem in problems), problems
