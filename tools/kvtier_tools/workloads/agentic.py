"""A seeded generator of agentic sessions: many concurrent agents, each a prefix that grows.

An agent (a coding agent such as SWE-agent or OpenHands) serves one task as a *session*: a
system prompt (its tool definitions, shared by every session of its kind), the task, then
turns. Each turn is one request that re-reads the whole prefix so far, a model output, and
a tool result appended to the prefix before the next request. Between two requests of a
session the tool runs (seconds to minutes); the serving engine serves other sessions
meanwhile, so a session's blocks must survive the others' traffic to be reused. A session
may spawn *sub-agents*: child sessions whose prompt starts with the parent's whole prefix,
which the parent waits for. A session ends (its task solved, its budget or context spent),
and its blocks are never read again: what a session hint can say and no block policy can
know (`kvtier.hints`, `Hierarchy.end_session`).

The figures, and where they come from (`AgenticParams` holds them):

- **Turns per session**: log-normal, median 40, capped at 150. Published analyses of
  SWE-agent trajectories on SWE-Bench Pro report median trajectory lengths of 29 to 78
  steps across four models (nilenso, "SWE-Bench Pro trajectory analysis", 2,920
  trajectories, https://nilenso.github.io/swe-bench-pro-cost-token-time-analysis/); one
  model's tasks span about 50 to 280 turns (Qwen3-Coder-Next's SWE-Bench Pro report).
- **Model output per turn**: log-normal, mean about 180 tokens: the Mooncake "tool&agent"
  trace's average output length (Qin et al., FAST 2025, the Mooncake traces' paper).
- **Tool result per turn**: log-normal, median 500 tokens, a heavy tail (a file read, a
  test log). An assumption: no analysis read here reports tool-output sizes; with it a
  40-turn session reaches about 30k tokens, close to reports that successful SWE-bench
  trajectories stay under about 20k tokens while failing ones grow longer (Raju et al.,
  "The Limits of Long-Context Reasoning in Automated Bug Fixing", arXiv 2602.16069).
- **Gaps between a session's requests**: the model's decode time plus the tool's run time,
  log-normal with median 6 s and sigma 1.3 (so 10 % above about 30 s and 1 % above about
  two minutes), plus, with probability 0.02 a turn, a human's pause of one to ten minutes.
  The shape is an assumption after Continuum (Li et al., arXiv 2511.02230), which
  measures agents' tool-call pauses on SWE-Bench and BFCL and reports them from seconds
  to minutes with large variance (its figures were not read here).
- **System prompts**: 3 agent kinds of 4k to 8k tokens (tool definitions); an assumption.
  Task prompts: log-normal, median 1.5k tokens; an assumption.
- **Sub-agents**: at each turn of a top-level session, probability 0.015 of spawning one
  (at most 3 per session; a sub-agent spawns none),
  which runs a median of 10 turns, then its summary (about 300 tokens) joins the parent's
  prefix. An assumption (the brief's shape; coding agents' "task" tools do this).
- **Arrivals**: sessions start uniformly over `span_s` (600 s), so most overlap: with the
  defaults about 100 sessions are live at the busiest moment.
- **Context**: a session ends when its prefix would pass `max_context_tokens` (128k).

Blocks are `MOONCAKE_BLOCK_TOKENS` (512) tokens, named as a Mooncake trace names them: a
full block keeps its id for the rest of its session (and its sub-agents); a request's last,
partial block covers tokens no later prompt repeats, so it gets a fresh id each time.

The output is a Mooncake JSONL trace with three more keys, which `read_mooncake` reads and
older readers ignore: `"session"` (its id, a string), `"parent_session"` (a sub-agent's
parent) and `"session_end": true` on a session's last request (it ends once served).
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import os
import random
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from kvtier.errors import InvalidValueError
from kvtier_tools.workloads.traces import MOONCAKE_BLOCK_TOKENS, TraceRequest


@dataclass(frozen=True, slots=True)
class AgenticParams:
    """The generator's parameters (see the module doc for their sources)."""

    sessions: int = 100
    """Top-level sessions (sub-agents come on top)."""
    span_s: float = 600.0
    """Sessions start uniformly within this many seconds."""
    seed: int = 0
    turns_median: float = 40.0
    turns_sigma: float = 0.6
    turns_max: int = 150
    output_mean_tokens: float = 180.0
    tool_median_tokens: float = 500.0
    tool_sigma: float = 1.0
    gap_median_s: float = 6.0
    gap_sigma: float = 1.3
    human_pause_p: float = 0.02
    human_pause_s: tuple[float, float] = (60.0, 600.0)
    agent_kinds: int = 3
    system_tokens: tuple[int, int] = (4096, 8192)
    task_median_tokens: float = 1500.0
    subagent_p: float = 0.015
    subagents_max: int = 3
    subagent_turns_median: float = 10.0
    subagent_summary_tokens: int = 300
    max_context_tokens: int = 131072

    def __post_init__(self) -> None:
        for name in ("sessions", "turns_max", "agent_kinds", "subagents_max", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidValueError(f"{name} must be a non-negative int, got {value!r}")
        if self.sessions < 1 or self.agent_kinds < 1:
            raise InvalidValueError("sessions and agent_kinds must be at least 1")
        for name in ("span_s", "turns_median", "gap_median_s", "tool_median_tokens"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise InvalidValueError(f"{name} must be a positive number, got {value!r}")
        for name in ("human_pause_p", "subagent_p"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 <= value <= 1):
                raise InvalidValueError(f"{name} must be a probability (0 to 1), got {value!r}")


@dataclass(frozen=True, slots=True)
class AgenticRequest:
    """One request of a generated session (a `TraceRequest` with its session)."""

    timestamp_ms: int
    session: str
    parent_session: str | None
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    session_end: bool

    def to_json(self) -> dict[str, Any]:
        """The request as a line of the trace (Mooncake's keys, then the session's)."""
        record: dict[str, Any] = {
            "timestamp": self.timestamp_ms,
            "input_length": self.input_length,
            "output_length": self.output_length,
            "hash_ids": list(self.hash_ids),
            "session": self.session,
        }
        if self.parent_session is not None:
            record["parent_session"] = self.parent_session
        if self.session_end:
            record["session_end"] = True
        return record

    def to_trace_request(self) -> TraceRequest:
        return TraceRequest(
            self.timestamp_ms,
            self.input_length,
            self.output_length,
            self.hash_ids,
            session=self.session,
            parent_session=self.parent_session,
            session_end=self.session_end,
        )


@dataclass(slots=True)
class _Session:
    """A session's state while the generator runs it."""

    name: str
    parent: _Session | None
    tokens: int
    blocks: list[int]
    """The ids of its full blocks, head first (a sub-agent's start with its parent's)."""
    turns_left: int
    subagents: int = 0
    children_live: int = 0
    waiting: bool = False
    turn: int = 0


@dataclass
class _Generator:
    params: AgenticParams
    rng: random.Random = field(init=False)
    next_block: int = 0
    out: list[AgenticRequest] = field(default_factory=list)
    queue: list[tuple[float, int, _Session]] = field(default_factory=list)
    order: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.params.seed)

    def new_block(self) -> int:
        self.next_block += 1
        return self.next_block - 1

    def lognormal(self, median_value: float, sigma: float) -> float:
        return median_value * math.exp(self.rng.gauss(0.0, sigma))

    def grow(self, session: _Session, tokens: int) -> None:
        """Append `tokens` to the session's prefix: the blocks they fill get ids."""
        session.tokens += tokens
        while len(session.blocks) < session.tokens // MOONCAKE_BLOCK_TOKENS:
            session.blocks.append(self.new_block())

    def schedule(self, at: float, session: _Session) -> None:
        heapq.heappush(self.queue, (at, self.order, session))
        self.order += 1

    def turns(self, median_value: float) -> int:
        drawn = round(self.lognormal(median_value, self.params.turns_sigma))
        return max(1, min(self.params.turns_max, drawn))

    def run(self) -> list[AgenticRequest]:
        p = self.params
        kinds = []
        for _ in range(p.agent_kinds):
            system = _Session("", None, 0, [], 0)
            self.grow(system, self.rng.randint(*p.system_tokens) // MOONCAKE_BLOCK_TOKENS * 512)
            kinds.append(system.blocks)
        for index in range(p.sessions):
            system_blocks = kinds[self.rng.randrange(p.agent_kinds)]
            session = _Session(
                f"s{index}",
                None,
                len(system_blocks) * MOONCAKE_BLOCK_TOKENS,
                list(system_blocks),
                self.turns(p.turns_median),
            )
            self.grow(session, max(64, round(self.lognormal(p.task_median_tokens, 0.7))))
            self.schedule(self.rng.uniform(0.0, p.span_s), session)
        while self.queue:
            at, _, session = heapq.heappop(self.queue)
            self.step(at, session)
        self.out.sort(key=lambda request: request.timestamp_ms)
        return self.out

    def step(self, at: float, session: _Session) -> None:
        """Serve one request of `session` at time `at`, then schedule what follows."""
        p = self.params
        output = max(1, round(self.lognormal(p.output_mean_tokens * 0.8, 0.6)))
        tool = max(16, round(self.lognormal(p.tool_median_tokens, p.tool_sigma)))
        session.turn += 1
        session.turns_left -= 1
        ends = session.turns_left <= 0 or session.tokens + output + tool > p.max_context_tokens
        self.record(at, session, output, ends)
        if ends:
            self.finish(at, session)
            return
        self.grow(session, output)
        gap = self.lognormal(p.gap_median_s, p.gap_sigma)
        if self.rng.random() < p.human_pause_p:
            gap += self.rng.uniform(*p.human_pause_s)
        if (
            session.parent is None
            and session.subagents < p.subagents_max
            and self.rng.random() < p.subagent_p
        ):
            self.spawn(at, session)
            return  # the parent waits for its sub-agent
        self.grow(session, tool)
        self.schedule(at + gap, session)

    def spawn(self, at: float, parent: _Session) -> None:
        parent.subagents += 1
        parent.children_live += 1
        parent.waiting = True
        child = _Session(
            f"{parent.name}.{parent.subagents}",
            parent,
            len(parent.blocks) * MOONCAKE_BLOCK_TOKENS,
            list(parent.blocks),
            self.turns(self.params.subagent_turns_median),
        )
        self.grow(child, max(64, round(self.lognormal(300.0, 0.5))))
        self.schedule(at + self.lognormal(1.0, 0.5), child)

    def finish(self, at: float, session: _Session) -> None:
        parent = session.parent
        if parent is None:
            return
        parent.children_live -= 1
        if parent.children_live == 0 and parent.waiting:
            parent.waiting = False
            self.grow(parent, self.params.subagent_summary_tokens)
            self.schedule(at + self.lognormal(2.0, 0.5), parent)

    def record(self, at: float, session: _Session, output: int, ends: bool) -> None:
        tokens = session.tokens
        ids = list(session.blocks[: tokens // MOONCAKE_BLOCK_TOKENS])
        if tokens % MOONCAKE_BLOCK_TOKENS:
            ids.append(self.new_block())  # the partial last block: never repeated
        parent = session.parent.name if session.parent is not None else None
        self.out.append(
            AgenticRequest(round(at * 1000), session.name, parent, tokens, output, tuple(ids), ends)
        )


def generate(params: AgenticParams | None = None) -> list[AgenticRequest]:
    """The requests of `params`' sessions (default `AgenticParams()`), in time order. The
    same parameters (seed included) always give the same requests."""
    return _Generator(params or AgenticParams()).run()


def write_trace(requests: Iterable[AgenticRequest], path: str | os.PathLike[str]) -> Path:
    """Write `requests` as a JSONL trace at `path` (zstd-compressed if it ends in `.zst`)."""
    target = Path(path)
    text = "".join(
        json.dumps(request.to_json(), separators=(",", ":")) + "\n" for request in requests
    ).encode()
    if target.suffix == ".zst":
        import zstandard

        text = zstandard.ZstdCompressor(level=10).compress(text)
    target.write_bytes(text)
    return target


@dataclass(frozen=True, slots=True)
class AgenticStats:
    """What a generated trace looks like (what the tests check against the parameters)."""

    requests: int
    sessions: int
    subagents: int
    ended: int
    block_accesses: int
    unique_blocks: int
    turns_median: float
    gap_median_s: float
    gap_p90_s: float
    final_tokens_median: float
    peak_live_sessions: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def trace_stats(requests: list[AgenticRequest]) -> AgenticStats:
    """Sessions, turns, gaps and size of a generated trace."""
    by_session: dict[str, list[AgenticRequest]] = {}
    for request in requests:
        by_session.setdefault(request.session, []).append(request)
    gaps: list[float] = []
    spans: list[tuple[int, int]] = []
    for own in by_session.values():
        gaps += [(b.timestamp_ms - a.timestamp_ms) / 1000 for a, b in itertools.pairwise(own)]
        spans.append((own[0].timestamp_ms, own[-1].timestamp_ms))
    gaps.sort()
    accesses = [key for request in requests for key in request.hash_ids]
    return AgenticStats(
        requests=len(requests),
        sessions=len(by_session),
        subagents=sum(1 for own in by_session.values() if own[0].parent_session is not None),
        ended=sum(1 for request in requests if request.session_end),
        block_accesses=len(accesses),
        unique_blocks=len(set(accesses)),
        turns_median=median(len(own) for own in by_session.values()),
        gap_median_s=median(gaps) if gaps else 0.0,
        gap_p90_s=gaps[int(0.9 * (len(gaps) - 1))] if gaps else 0.0,
        final_tokens_median=median(own[-1].input_length for own in by_session.values()),
        peak_live_sessions=_peak(spans),
    )


def _peak(spans: list[tuple[int, int]]) -> int:
    """The most sessions live (between their first and last request) at once."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    live = peak = 0
    for _, step in events:
        live += step
        peak = max(peak, live)
    return peak


def iter_json_lines(requests: Iterable[AgenticRequest]) -> Iterator[str]:
    """Each request as one JSON line (no newline)."""
    for request in requests:
        yield json.dumps(request.to_json(), separators=(",", ":"))
