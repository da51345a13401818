"""A conformance suite's failed check shows the values it compared in a third party's test
run, not a bare AssertionError (kvtier.testing registers its modules for pytest's assertion
rewriting, which pytest otherwise applies only to test files)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

THIRD_PARTY_TESTS = '''
from kvtier.policies import LRUCachePolicy
from kvtier.testing import PolicyTests


class MiscountingLRU(LRUCachePolicy):
    """Says it holds one block more than it does."""

    def __len__(self) -> int:
        return super().__len__() + 1


class TestMiscountingLRU(PolicyTests):
    policy_class = MiscountingLRU
'''


def test_a_failed_suite_check_shows_the_values_it_compared(tmp_path: Path) -> None:
    (tmp_path / "test_third_party.py").write_text(THIRD_PARTY_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not kvtier's configuration
    run = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"),
            *("test_third_party.py", "-k", "test_insert_then_get_returns_the_same_block"),
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # this checkout's kvtier
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 failed" in run.stdout and str(ROOT / "kvtier") in run.stdout, run.stdout
    # The suite's `assert len(policy) == 1`, with what len() returned.
    assert "assert 2 == 1" in run.stdout, run.stdout
