"""What the lanes run in environments of their own (tests/engine/, tests/sglang_lane/) set up
alike: a distribution's release checked, a lane that cannot run failing under CI rather than
passing empty, every test skipped with the reason elsewhere, and the figures a lane reports
in its closing summary. Each lane's conftest.py imports it (tests/ on its sys.path); it needs
only pytest, so either lane's environment can import it.
"""

from __future__ import annotations

import importlib.metadata
import os

import pytest

FIGURES = pytest.StashKey[list[str]]()
"""The lines a lane's `report` fixture added, for its closing summary."""


def missing_release(
    name: str, release: str, lane: str, setup: str, *, local_label: bool = False
) -> str | None:
    """Why distribution `name` at `release` is not usable here, or None; `setup` says what
    builds the lane's environment; with `local_label`, a local version label ("+cpu") is
    ignored."""
    try:
        found = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return f"{name} is not installed here ({setup})"
    if (found.split("+")[0] if local_label else found) != release:
        return f"{name} {found} is installed; the {lane} lane is written for {release}"
    return None


def fail_under_ci(lane: str, reason: str | None, setup_flag: str) -> None:
    """Raise when CI (CI=true) runs the lane but it cannot run (`reason`): CI installs what it
    needs, so the lane must fail, not pass empty."""
    if reason is not None and os.environ.get("CI") == "true":
        raise RuntimeError(
            f"CI runs the {lane} lane, but {reason}; scripts/test installs it with "
            f"`scripts/setup.sh {setup_flag}`"
        )


def skip_all(items: list[pytest.Item], reason: str | None) -> None:
    """Mark every collected test skipped with `reason` (nothing when it is None)."""
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        item.add_marker(skip)


def figures(config: pytest.Config) -> list[str]:
    """The lane's figures so far (a `report` fixture appends to this list)."""
    return config.stash.setdefault(FIGURES, [])


def write_figures(reporter: pytest.TerminalReporter, config: pytest.Config, title: str) -> None:
    """The lane's figures as a section `title` of the closing summary (none: no section)."""
    lines = config.stash.get(FIGURES, [])
    if lines:
        reporter.section(title)
        for line in lines:
            reporter.write_line(line)
