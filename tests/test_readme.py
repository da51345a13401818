"""The README's Python examples run as written, and its commands exist."""

from __future__ import annotations

import os
import re
from pathlib import Path

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
