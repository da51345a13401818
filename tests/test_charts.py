"""The charts: what the eye needs is there (a colour per tier and per policy, lines that do
not hide each other, the gap to the infinite cache, titles inside the figure), and
`--no-plot` leaves no chart of an earlier run beside new figures."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvtier.cli import main

pytest.importorskip("matplotlib")

from kvtier_tools.cli.charts import (
    INFINITE_COLOR,
    TIER_COLORS,
    policy_colors,
    title_lines,
)
from kvtier_tools.cli.replay_chart import _pair_style, plot_replay, replay_figure

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout + result.stderr


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The report of a short replay of the shipped trace through the default chain."""
    out = tmp_path_factory.mktemp("replay")
    code, output = run(
        "replay", "--limit", "200", "--block-bytes", "4KiB", "--no-plot", "--out", str(out)
    )
    assert code == 0, output
    document: dict[str, Any] = json.loads((out / "report.json").read_text())
    return document


def _texts_inside(figure: Any) -> None:
    """Every title of `figure` lies inside the figure (none is cut off at an edge)."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    width, height = figure.bbox.width, figure.bbox.height
    titles = [figure._suptitle] if figure._suptitle else []
    for axes in figure.axes:
        titles += [axes.title, axes._left_title, axes._right_title]
    for text in titles:
        if not text.get_text():
            continue
        box = text.get_window_extent(renderer)
        assert box.x0 >= 0 and box.x1 <= width and box.y1 <= height, text.get_text()


# -- no-plot removes a stale chart -----------------------------------------------------------


def test_replay_no_plot_removes_the_previous_runs_chart(tmp_path: Path) -> None:
    stale = tmp_path / "replay.png"
    stale.write_bytes(PNG_MAGIC + b"an earlier run's chart")
    code, output = run(
        "replay", "--limit", "5", "--block-bytes", "4KiB", "--no-plot", "--out", str(tmp_path)
    )
    assert code == 0, output
    assert (tmp_path / "report.json").exists() and not stale.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--policy", "lru", "--capacity", "1%"],
        ["--tiers", "2,8"],
    ],
    ids=["sweep", "chain"],
)
def test_simulate_no_plot_removes_the_previous_runs_chart(tmp_path: Path, args: list[str]) -> None:
    stale = tmp_path / "simulate.png"
    stale.write_bytes(PNG_MAGIC + b"an earlier run's chart")
    code, output = run("simulate", *args, "--limit", "20", "--no-plot", "--out", str(tmp_path))
    assert code == 0, output
    assert (tmp_path / "simulate.json").exists() and not stale.exists()


# -- colours, lines and titles ---------------------------------------------------------------


def test_every_policy_has_its_own_colour_lct_included() -> None:
    colors = policy_colors(["lru", "arc", "lct", "opt", "someday"])
    assert len(set(colors.values())) == 5
    assert INFINITE_COLOR not in colors.values()
    assert INFINITE_COLOR not in TIER_COLORS


@pytest.mark.slow
def test_the_lct_curve_has_its_own_colour_and_label(tmp_path: Path) -> None:
    code, output = run(
        "simulate", "--policy", "lru,arc,lct", "--capacity", "1%", "--limit", "300",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, output
    assert (tmp_path / "simulate.png").read_bytes().startswith(PNG_MAGIC)


def test_a_pair_has_its_lower_tiers_colour_and_overlapping_pairs_stay_apart() -> None:
    tiers = {"cpu": 0, "disk": 1}
    put = _pair_style("caller->cpu", tiers)
    get = _pair_style("cpu->caller", tiers)
    demote = _pair_style("cpu->disk", tiers)
    promote = _pair_style("disk->cpu", tiers)
    assert put[0] == get[0] == TIER_COLORS[0] and demote[0] == promote[0] == TIER_COLORS[1]
    assert put[1] == demote[1] == "-" and get[1] == promote[1] == "--"
    # caller -> cpu and cpu -> disk carry about the same bytes: the deeper one is drawn
    # wider and beneath, so the one on top never hides it.
    assert demote[2] > put[2] and demote[4] < put[4]


def test_the_replay_chart_shows_the_gap_and_one_colour_per_tier(report: dict[str, Any]) -> None:
    figure = replay_figure(report)
    top, gap, bottom = figure.axes
    tiers = [tier["name"] for tier in report["tiers"]]
    handles, labels = top.get_legend_handles_labels()
    areas = [h for h, label in zip(handles, labels, strict=True) if label.split()[0] in tiers]
    assert len(areas) == len(tiers)
    area_colors = [tuple(area.get_facecolor()[0][:3]) for area in areas]
    from matplotlib.colors import to_rgb

    assert area_colors == [to_rgb(TIER_COLORS[i]) for i in range(len(tiers))]
    for line in bottom.get_lines():  # every pair in the colour of a tier of the top panel
        assert to_rgb(line.get_color()) in [to_rgb(c) for c in TIER_COLORS[: len(tiers)]]
    series = report["series"]
    gap_line = gap.get_lines()[0].get_ydata()
    chain = [sum(hits) for hits in zip(*series["tier_hits"].values(), strict=True)]
    expected = (series["infinite_hits"][-1] - chain[-1]) / series["block_accesses"][-1] * 100
    assert gap_line[-1] == pytest.approx(expected)


def test_the_chain_total_is_a_line_of_its_own_beneath_the_dashed_bound(
    report: dict[str, Any],
) -> None:
    top = replay_figure(report).axes[0]
    lines = {line.get_label().split(":")[0]: line for line in top.get_lines()}
    chain, bound = lines["chain (all tiers)"], lines["infinite cache"]
    series = report["series"]
    hits = [sum(column) for column in zip(*series["tier_hits"].values(), strict=True)]
    expected = [h / a for h, a in zip(hits, series["block_accesses"], strict=True)]
    assert list(chain.get_ydata()) == pytest.approx(expected)
    # where the two meet, the bound's dashes leave the chain's solid line visible
    assert bound.get_linestyle() != "-" and chain.get_linestyle() == "-"
    assert bound.get_zorder() >= chain.get_zorder()
    assert top.get_lines().index(bound) > top.get_lines().index(chain)


@pytest.mark.slow
def test_a_partial_replays_title_says_so_and_stays_inside_the_figure(
    report: dict[str, Any], tmp_path: Path
) -> None:
    partial = copy.deepcopy(report)
    partial["partial"] = partial["interrupted"] = True
    partial["trace"]["requests_planned"] = 12_031
    partial["trace"]["name"] = "a_rather_long_trace_name_from_production_" * 2 + ".jsonl.zst"
    figure = replay_figure(partial)
    title = figure.axes[0].get_title()
    assert "PARTIAL (interrupted): 200 of 12,031 requests" in title
    _texts_inside(figure)
    assert plot_replay(tmp_path / "x.png", partial).read_bytes().startswith(PNG_MAGIC)


def test_title_lines_wraps_long_lines() -> None:
    title = title_lines("short", "word " * 40, "")
    assert title.splitlines()[0] == "short"
    assert all(len(line) <= 90 for line in title.splitlines())


@pytest.mark.slow
def test_a_config_chain_is_titled_by_its_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvtier_tools.cli import charts

    titles: list[str] = []
    draw = charts.plot_tier_hits_over_replay

    def spy(path: Path, **kwargs: Any) -> Path:
        titles.append(kwargs["title"])
        return draw(path, **kwargs)

    monkeypatch.setattr(charts, "plot_tier_hits_over_replay", spy)
    code, output = run(
        "simulate", "--config", "configs/default.toml", "--limit", "50", "--out", str(tmp_path)
    )
    assert code == 0, output
    assert titles[0].startswith("kvtier simulate --config configs/default.toml (write-back)")
    assert "--tiers" not in titles[0]
    code, output = run("simulate", "--tiers", "2,8", "--limit", "50", "--out", str(tmp_path))
    assert code == 0, output
    assert titles[1].startswith("kvtier simulate --tiers 2,8 (write-back)")
