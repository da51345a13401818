"""`python -m kvtier_tools.bench.fleet_index`: what it reports (memory per entry, both apply
rates, a score's time), never how fast."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("msgspec")

from kvtier_tools.bench import fleet_index

pytestmark = pytest.mark.timeout(120)


def test_the_benchmark_reports_memory_rates_and_score_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fleet_index.main(["--entries", "3000", "--key-bytes", "12", "--nodes", "3", "--json"])
    figures = json.loads(capsys.readouterr().out)
    assert (figures["entries"], figures["key_bytes"], figures["nodes"]) == (3000, 12, 3)
    # each entry holds at least its key's bytes object (33 bytes of header + 12)
    assert figures["traced_bytes_per_entry"] >= 45
    assert figures["estimated_bytes_per_entry"] >= 45
    for name in ("apply_payload_key_events_per_s", "apply_moves_key_events_per_s", "score_us"):
        assert figures[name] > 0


def test_the_table_names_each_figure(capsys: pytest.CaptureFixture[str]) -> None:
    fleet_index.main(["--entries", "1000", "--repeats", "1"])
    out = capsys.readouterr().out
    for words in ("1,000 entries of 36-byte keys", "B/entry traced", "apply_payload", "score"):
        assert words in out


def test_a_bad_option_is_refused_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        fleet_index.main(["--key-bytes", "300"])
    assert "--key-bytes" in capsys.readouterr().err
