"""The multi-turn workload of `engine_ttft` (issue 35, item 4), and its report by turn depth.

**The workload.** Conversations of the shipped Mooncake trace: requests sharing their first
two hash ids are one conversation, and a request's turn is its place among them in trace
order. The first `conversations` conversations of at least `MIN_TURNS` turns are taken, the
first `turns` turns of each, in trace order (so conversations interleave, as they do on a
server), each request cut to its first `max_blocks` blocks; each hash id is a fixed block of
32 token ids, so a later turn's prompt really begins with the earlier turns'. The engine's
own KV cache is held below the conversations' blocks, so by the time a conversation comes
back its blocks have left vLLM's cache: what a later turn finds is what an offloading tier
kept.

**The report.** Per turn depth (1, 2-3, 4-7, 8+) and way (vLLM alone, kvtier's cpu tier,
kvtier's cpu -> disk chain): requests, TTFT p50 / p99 (vLLM's own: arrival to first token),
prompt tokens, and prefill tokens saved (prompt tokens loaded instead of computed, vLLM's
`num_cached_tokens`), with where it ran (`machine()`) and the load average before and after.
"""

from __future__ import annotations

import collections
import os
import platform
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

BLOCK = 32
"""Tokens per hash id of the trace (and per vLLM block)."""
MIN_TURNS = 8
"""Conversations shorter than this are left out: the deep turns are the point."""
DEPTHS: tuple[tuple[str, int, int | None], ...] = (
    ("1", 1, 1),
    ("2-3", 2, 3),
    ("4-7", 4, 7),
    ("8+", 8, None),
)
"""Turn-depth buckets: (label, first turn, last turn or None for no end)."""


def block_tokens(hash_id: int, vocab: int) -> list[int]:
    """The fixed token ids of one hash id of the trace (ids below 3 are left to specials)."""
    rng = random.Random(hash_id * 7919 + 1)
    return [rng.randrange(3, vocab) for _ in range(BLOCK)]


@dataclass(frozen=True)
class Conversations:
    """The chosen requests in trace order: each one's prompt, turn (1-based) and figures."""

    prompts: list[list[int]]
    turns: list[int]
    conversations: int
    blocks: int
    unique_blocks: int

    @property
    def tokens(self) -> int:
        return sum(len(prompt) for prompt in self.prompts)


def conversations(
    count: int, turns: int, max_blocks: int, vocab: int, trace: Sequence[Any] | None = None
) -> Conversations:
    """The workload (see the module's docstring) from `trace` (default: the shipped one)."""
    if count < 1 or turns < 1 or max_blocks < 1:
        raise ValueError(
            f"count, turns and max_blocks must be >= 1, got {count, turns, max_blocks}"
        )
    if trace is None:
        from kvtier_tools.workloads.traces import read_mooncake

        trace = list(read_mooncake())
    sizes = collections.Counter(request.hash_ids[:2] for request in trace)
    chosen: list[tuple[int, ...]] = []
    for request in trace:
        key = request.hash_ids[:2]
        if sizes[key] >= MIN_TURNS and key not in chosen:
            chosen.append(key)
            if len(chosen) == count:
                break
    seen: collections.Counter[tuple[int, ...]] = collections.Counter()
    hash_lists: list[tuple[int, ...]] = []
    depth: list[int] = []
    for request in trace:
        key = request.hash_ids[:2]
        if key in chosen and seen[key] < turns:
            seen[key] += 1
            hash_lists.append(tuple(request.hash_ids[:max_blocks]))
            depth.append(seen[key])
    unique = {hash_id for hash_ids in hash_lists for hash_id in hash_ids}
    return Conversations(
        prompts=[
            [token for hash_id in hash_ids for token in block_tokens(hash_id, vocab)]
            for hash_ids in hash_lists
        ],
        turns=depth,
        conversations=len(chosen),
        blocks=sum(len(hash_ids) for hash_ids in hash_lists),
        unique_blocks=len(unique),
    )


def depth_label(turn: int) -> str:
    """The bucket of DEPTHS a turn falls in."""
    for label, first, last in DEPTHS:
        if turn >= first and (last is None or turn <= last):
            return label
    raise ValueError(f"a turn is >= 1, got {turn}")


# -- the text report ---------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile `q` (0-100) of `values` (not empty)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def table(rows: list[list[str]]) -> str:
    """A plain text table: the first row is the header, the first column left-aligned."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = []
    for index, row in enumerate(rows):
        lines.append(
            "  ".join(
                cell.ljust(width) if column == 0 else cell.rjust(width)
                for column, (cell, width) in enumerate(zip(row, widths, strict=True))
            )
        )
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def depth_rows(
    turns: Sequence[int],
    served: Mapping[str, Sequence[Mapping[str, Any]]],
    titles: Mapping[str, str],
) -> list[list[str]]:
    """The per-depth table (header first): for each depth present and each way of `served`
    (way -> its requests, in the workload's order), requests, TTFT p50 / p99, prompt tokens
    and prefill tokens saved (loaded instead of computed), with their share."""
    rows = [["turn", "way", "requests", "TTFT p50", "TTFT p99", "prompt tokens", "prefill saved"]]
    labels = [depth_label(turn) for turn in turns]
    for label, _, _ in DEPTHS:
        picked = [index for index, found in enumerate(labels) if found == label]
        if not picked:
            continue
        for way, requests in served.items():
            ttfts = [float(requests[index]["ttft_s"]) for index in picked]
            prompt = sum(int(requests[index]["prompt_tokens"]) for index in picked)
            saved = sum(int(requests[index]["cached_tokens"]) for index in picked)
            rows.append(
                [
                    label,
                    titles.get(way, way),
                    str(len(picked)),
                    ms(percentile(ttfts, 50)),
                    ms(percentile(ttfts, 99)),
                    f"{prompt:,}",
                    f"{saved:,} ({saved / prompt:.0%})" if prompt else "0",
                ]
            )
    return rows


def machine() -> str:
    """Where the run is: the platform, the CPU model, the cores this process may use of the
    machine's, and the load average now (1, 5, 15 minutes)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{platform.platform()}; {cpu}; {usable} of {os.cpu_count()} cores; {load()}"


def load() -> str:
    """The load average now, in words."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} (1 / 5 / 15 min)"
