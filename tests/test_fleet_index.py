"""The fleet's prefix index (issue 32, item 3): restarts, gaps, duplicates, stale and unknown
nodes, scoring by prefix, tier and load, moves between tiers, the entries bound; and a fuzz
of malformed payloads, each counted and dropped, never raised, never grown into."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any
from unittest.mock import patch

import pytest

pytest.importorskip("msgspec")

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.errors import InvalidValueError, KeyFormatError
from kvtier.fleet.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    WireEvent,
    block_stored,
    decode_batch,
    encode_batch,
)
from kvtier.fleet.index import (
    DEFAULT_TIER_WEIGHTS,
    MAX_MEDIA,
    MAX_PAYLOAD_BYTES,
    SEQ_BITS,
    ApplyOutcome,
    PrefixIndex,
    key_of,
)

pytestmark = pytest.mark.timeout(120)

INC = 7


def k(i: int) -> bytes:
    """Block key `i` (12 bytes, as a 8-byte hash and a group index)."""
    return i.to_bytes(8, "big") + b"\0\0\0\0"


def seq(n: int, incarnation: int = INC) -> int:
    return incarnation << SEQ_BITS | n


def stored(
    keys: Sequence[bytes | int], medium: str | None = "CPU", tier: str = "cpu"
) -> BlockStored:
    return block_stored(keys, medium, block_size=16, ownership=tier)


def removed(keys: Sequence[bytes | int], medium: str = "CPU") -> BlockRemoved:
    return BlockRemoved(block_hashes=list(keys), medium=medium)


def batch(*events: WireEvent) -> KVEventBatch:
    return KVEventBatch(ts=0.0, events=list(events))


def fed(index: PrefixIndex, node: str, *batches: KVEventBatch, incarnation: int = INC) -> None:
    """Feed `batches` as `node`'s first ones (n from 0), each applied."""
    for n, one in enumerate(batches):
        outcome = index.apply(node, seq(n, incarnation), one)
        assert outcome in (ApplyOutcome.APPLIED, ApplyOutcome.RESTART)


# -- sequence numbers -----------------------------------------------------------------------


def test_batches_in_order_are_applied_and_held_per_medium() -> None:
    index = PrefixIndex()
    fed(index, "a", batch(AllBlocksCleared()), batch(stored([k(1), k(2)]), stored([k(2)], "DISK")))
    assert index.holdings("a") == {k(1): {"CPU"}, k(2): {"CPU", "DISK"}}
    assert index.expected_seq("a") == seq(2)
    stats = index.stats()
    assert (stats.nodes, stats.entries, stats.keys, stats.batches_applied) == (1, 2, 2, 2)


def test_a_duplicate_batch_is_ignored() -> None:
    index = PrefixIndex()
    fed(index, "a", batch(stored([k(1)])), batch(removed([k(1)])))
    assert index.apply("a", seq(0), batch(stored([k(1)]))) is ApplyOutcome.DUPLICATE
    assert index.holdings("a") == {}
    assert index.stats().duplicates == 1


def test_a_restart_drops_the_nodes_entries_then_applies() -> None:
    index = PrefixIndex()
    fed(index, "a", batch(stored([k(1), k(2)])))
    fed(index, "b", batch(stored([k(1)])))
    outcome = index.apply("a", seq(0, incarnation=INC + 1), batch(stored([k(3)])))
    assert outcome is ApplyOutcome.RESTART
    assert index.holdings("a") == {k(3): {"CPU"}}
    assert index.holdings("b") == {k(1): {"CPU"}}  # the other node is untouched
    assert index.expected_seq("a") == seq(1, incarnation=INC + 1)
    assert index.stats().restarts == 1
    assert index.stats().entries == 2


def test_a_restart_that_missed_its_first_batches_is_a_gap() -> None:
    index = PrefixIndex()
    fed(index, "a", batch(stored([k(1)])))
    outcome = index.apply("a", seq(3, incarnation=INC + 1), batch(stored([k(2)])))
    assert outcome is ApplyOutcome.GAP
    assert index.holdings("a") == {}  # the old incarnation's entries are gone
    assert index.stats().entries == 0
    assert index.expected_seq("a") == seq(0, incarnation=INC + 1)


def test_a_gap_makes_the_node_stale_and_a_replay_heals_it() -> None:
    index = PrefixIndex()
    fed(index, "a", batch(stored([k(1)])), batch(stored([k(2)])))
    assert index.apply("a", seq(3), batch(stored([k(4)]))) is ApplyOutcome.GAP
    assert index.is_stale("a")
    assert index.holdings("a") == {}
    assert index.score([k(1)]) == []  # a stale node answers nothing
    assert index.apply("a", seq(4), batch(stored([k(5)]))) is ApplyOutcome.STALE
    assert index.expected_seq("a") == seq(2)
    # the replay: from the expected batch on, in order
    assert index.apply("a", seq(2), batch(removed([k(1)]))) is ApplyOutcome.APPLIED
    assert index.apply("a", seq(3), batch(stored([k(4)]))) is ApplyOutcome.APPLIED
    assert not index.is_stale("a")
    assert set(index.holdings("a")) == {k(2), k(4)}
    stats = index.stats()
    assert (stats.gaps, stats.stale_batches, stats.stale_nodes) == (1, 1, 0)


def test_a_snapshot_replaces_a_stale_nodes_entries() -> None:
    index = PrefixIndex()
    fed(index, "a", batch(stored([k(1), k(2)])))
    assert index.apply("a", seq(5), batch(stored([k(9)]))) is ApplyOutcome.GAP
    index.replace_node("a", seq(6), {"DISK": [k(2), k(3)], "GPU": [k(3)]})
    assert index.holdings("a") == {k(2): {"DISK"}, k(3): {"DISK", "GPU"}}
    assert index.stats().entries == 2
    assert index.apply("a", seq(6), batch(stored([k(8)]))) is ApplyOutcome.DUPLICATE
    assert index.apply("a", seq(7), batch(removed([k(2)], "DISK"))) is ApplyOutcome.APPLIED
    assert index.holdings("a") == {k(3): {"DISK", "GPU"}}


def test_a_bad_snapshot_names_the_node_and_medium_and_changes_nothing() -> None:
    index = PrefixIndex()
    fed(index, "a", batch(stored([k(1)])))
    with pytest.raises(KeyFormatError, match="snapshot of 'a', medium 'DISK'"):
        index.replace_node("a", seq(3), {"CPU": [k(2)], "DISK": [k(3), b""]})
    with pytest.raises(InvalidValueError, match="seq"):
        index.replace_node("a", -1, {})
    assert index.holdings("a") == {k(1): {"CPU"}}
    assert index.expected_seq("a") == seq(1)


def test_a_first_batch_past_zero_is_a_gap_until_a_snapshot() -> None:
    """A subscriber that joins a running publisher cannot know what came before."""
    index = PrefixIndex()
    assert index.apply("a", seq(40), batch(stored([k(1)]))) is ApplyOutcome.GAP
    assert index.score([k(1)]) == []
    index.replace_node("a", seq(40), {"CPU": [k(1)]})
    assert [m.node for m in index.score([k(1)])] == ["a"]


def test_all_blocks_cleared_drops_the_nodes_entries() -> None:
    index = PrefixIndex()
    fed(index, "a", batch(stored([k(1), k(2)])), batch(AllBlocksCleared(), stored([k(3)])))
    assert index.holdings("a") == {k(3): {"CPU"}}
    assert index.stats().entries == 1


def test_a_bad_sequence_number_or_node_is_rejected() -> None:
    index = PrefixIndex()
    good = batch(stored([k(1)]))
    for node, number in (("a", -1), ("a", 1 << 64), ("", 0), ("a", True)):
        assert index.apply(node, number, good) is ApplyOutcome.REJECTED
    assert index.stats().batches_rejected == 4
    assert index.nodes() == []


def test_forget_drops_a_node() -> None:
    index = PrefixIndex()
    fed(index, "a", batch(stored([k(1)])))
    index.set_load("a", 3)
    index.forget("a")
    assert index.nodes() == []
    assert index.expected_seq("a") is None
    assert index.stats().entries == 0


# -- moves between tiers --------------------------------------------------------------------


def test_a_move_down_keeps_the_block_on_the_lower_tier() -> None:
    """The chain's order for a move: the store below, then the removal above."""
    index = PrefixIndex()
    fed(index, "a", batch(stored([k(1)], "CPU")), batch(stored([k(1)], "DISK", "disk")))
    fed_more = index.apply("a", seq(2), batch(removed([k(1)], "CPU")))
    assert fed_more is ApplyOutcome.APPLIED
    assert index.holdings("a") == {k(1): {"DISK"}}
    (match,) = index.score([k(1)])
    assert match.per_tier == {"DISK": 1}
    assert match.score == pytest.approx(DEFAULT_TIER_WEIGHTS["DISK"])


def test_a_removal_of_a_key_not_held_changes_nothing() -> None:
    index = PrefixIndex()
    fed(index, "a", batch(stored([k(1)])), batch(removed([k(2)]), removed([k(1)], "DISK")))
    assert index.holdings("a") == {k(1): {"CPU"}}


def test_a_medium_of_none_is_the_gpu_and_int_keys_are_their_64_bits() -> None:
    index = PrefixIndex()
    event = block_stored([-1, 5], None, block_size=16)
    fed(index, "a", batch(event))
    assert index.holdings("a") == {b"\xff" * 8: {"GPU"}, (5).to_bytes(8, "big"): {"GPU"}}
    assert index.score([-1, 5])[0].matched_blocks == 2
    assert key_of(-1) == key_of((1 << 64) - 1)


# -- scoring --------------------------------------------------------------------------------


def test_a_node_never_heard_of_answers_nothing() -> None:
    index = PrefixIndex()
    fed(index, "a", batch(stored([k(1)])))
    assert [m.node for m in index.score([k(1)], nodes=["a", "ghost"])] == ["a"]
    assert index.score([k(1)], nodes=["ghost"]) == []
    assert index.holdings("ghost") == {}
    assert index.expected_seq("ghost") is None


def test_the_longest_prefix_counts_not_the_keys_held_after_a_miss() -> None:
    index = PrefixIndex()
    fed(index, "a", batch(stored([k(1), k(2), k(4), k(5)])))
    (match,) = index.score([k(1), k(2), k(3), k(4), k(5)])
    assert match.matched_blocks == 2
    assert match.per_tier == {"CPU": 2}


def test_scoring_weighs_each_block_by_its_best_tier() -> None:
    index = PrefixIndex()
    keys = [k(i) for i in range(4)]
    fed(index, "gpu2", batch(stored(keys[:2], "GPU"), stored(keys[:2], "DISK")))
    fed(index, "cpu3", batch(stored(keys[:3], "CPU")))
    fed(index, "disk4", batch(stored(keys, "DISK")))
    fed(index, "none", batch(stored([k(99)], "GPU")))
    ranked = index.score(keys)
    assert [m.node for m in ranked] == ["cpu3", "disk4", "gpu2", "none"]
    by_node = {m.node: m for m in ranked}
    assert by_node["gpu2"].per_tier == {"GPU": 2}
    assert by_node["gpu2"].score == pytest.approx(2.0)
    assert by_node["cpu3"].score == pytest.approx(2.4)
    assert by_node["disk4"].score == pytest.approx(2.0)
    assert by_node["none"].matched_blocks == 0
    assert by_node["none"].score == 0.0


def test_equal_scores_rank_by_node_name() -> None:
    index = PrefixIndex()
    for node in ("c", "a", "b"):
        fed(index, node, batch(stored([k(1)])))
    assert [m.node for m in index.score([k(1)])] == ["a", "b", "c"]


def test_the_load_term_lowers_a_score() -> None:
    index = PrefixIndex(load_weight=0.5)
    fed(index, "busy", batch(stored([k(1), k(2)], "GPU")))
    fed(index, "idle", batch(stored([k(1)], "GPU")))
    assert [m.node for m in index.score([k(1), k(2)])] == ["busy", "idle"]
    index.set_load("busy", 3)
    ranked = index.score([k(1), k(2)])
    assert [m.node for m in ranked] == ["idle", "busy"]
    assert ranked[1].score == pytest.approx(2.0 - 1.5)
    assert ranked[1].load == 3.0


def test_weights_are_configurable_by_lowercase_medium() -> None:
    index = PrefixIndex(weights={"disk": 2.0})
    fed(index, "a", batch(stored([k(1)], "DISK")))
    assert index.score([k(1)])[0].score == pytest.approx(2.0)
    with pytest.raises(InvalidValueError, match="'cpu'"):
        PrefixIndex(weights={"cpu": -1.0})


def test_a_bad_load_or_key_is_named() -> None:
    index = PrefixIndex()
    with pytest.raises(InvalidValueError, match=r"'a'.*nan"):
        index.set_load("a", float("nan"))
    with pytest.raises(KeyFormatError, match="str"):
        index.score(["00ff"])  # type: ignore[list-item]


def test_scores_taken_while_a_thread_applies_see_whole_batches() -> None:
    """One lock: a score sees a node's batches whole, in order (batch i stores key i), so
    the prefix it reports only grows, and ends complete. No timing is assumed."""
    index = PrefixIndex()
    keys = [k(i) for i in range(300)]

    def feed() -> None:
        for n, key in enumerate(keys):
            index.apply("a", seq(n), batch(stored([key])))

    feeder = threading.Thread(target=feed)
    feeder.start()
    seen = []
    while feeder.is_alive():
        seen.extend(match.matched_blocks for match in index.score(keys))
    feeder.join()
    seen.append(index.score(keys)[0].matched_blocks)
    assert seen == sorted(seen)
    assert seen[-1] == len(keys)


# -- memory ---------------------------------------------------------------------------------


def test_past_max_entries_new_stores_are_dropped_and_counted() -> None:
    index = PrefixIndex(max_entries=3)
    fed(index, "a", batch(stored([k(i) for i in range(5)])), batch(stored([k(0)], "DISK")))
    fed(index, "b", batch(stored([k(7)])))
    assert len(index.holdings("a")) == 3
    assert index.holdings("a")[k(0)] == {"CPU", "DISK"}  # a known key still gains a medium
    assert index.holdings("b") == {}
    stats = index.stats()
    assert (stats.entries, stats.stores_dropped) == (3, 3)
    index.apply("a", seq(2), batch(removed([k(0)], "CPU"), removed([k(0)], "DISK")))
    index.apply("b", seq(1), batch(stored([k(7)])))
    assert index.holdings("b") == {k(7): {"CPU"}}  # room again once one is removed


def test_memory_bytes_grows_with_entries_and_returns_when_dropped() -> None:
    index = PrefixIndex()
    empty = index.stats().memory_bytes
    fed(index, "a", batch(stored([k(i) for i in range(10_000)])))
    full = index.stats().memory_bytes
    assert full - empty >= 10_000 * (len(k(0)) + 33)  # at least the keys' bytes objects
    index.forget("a")
    assert index.stats().memory_bytes == empty


def test_too_many_media_rejects_the_batch_that_names_one_more() -> None:
    index = PrefixIndex()
    events = [stored([k(i)], f"M{i}") for i in range(MAX_MEDIA)]  # 6 known + these
    outcomes = [index.apply("a", seq(n), batch(event)) for n, event in enumerate(events)]
    assert ApplyOutcome.REJECTED in outcomes
    assert index.stats().batches_rejected == outcomes.count(ApplyOutcome.REJECTED)


# -- bad payloads ---------------------------------------------------------------------------


def test_a_malformed_payload_is_rejected_and_counted() -> None:
    index = PrefixIndex()
    good = encode_batch(batch(stored([k(1)])))
    too_long_key = encode_batch(batch(stored([b"x" * 256])))
    empty_key = encode_batch(batch(stored([b""])))
    for payload in (b"", b"\xc1", good[:-1], too_long_key, empty_key, b"\x00" * 9, b"\x93"):
        assert index.apply_payload("a", seq(0), payload) is ApplyOutcome.REJECTED
    assert index.apply_payload("a", seq(0), b"x" * (MAX_PAYLOAD_BYTES + 1)) is (
        ApplyOutcome.REJECTED
    )
    assert index.stats().batches_rejected == 8
    assert index.nodes() == []
    assert index.apply_payload("a", seq(0), good) is ApplyOutcome.APPLIED


def test_a_batch_with_one_bad_event_applies_none_of_it() -> None:
    index = PrefixIndex()
    for bad in (stored([b"x" * 300]), stored([1 << 64]), stored([k(2)], "x" * 65)):
        assert index.apply("a", seq(0), batch(stored([k(1)]), bad)) is ApplyOutcome.REJECTED
    assert index.nodes() == []
    assert index.stats().entries == 0


_FEW_KEYS = st.sampled_from([k(i) for i in range(8)])  # so stores and removals meet
_KEYS = st.one_of(
    _FEW_KEYS,
    st.binary(min_size=0, max_size=300),
    st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1),
)
_MEDIA = st.sampled_from(["CPU", "DISK", "GPU"])


def _events(keys: st.SearchStrategy[bytes | int], media: st.SearchStrategy[str | None]) -> Any:
    return st.one_of(
        st.builds(stored, st.lists(keys, max_size=20), media),
        st.builds(removed, st.lists(keys, max_size=20), _MEDIA),
        st.just(AllBlocksCleared()),
    )


_GOOD = st.lists(_events(_FEW_KEYS, _MEDIA), max_size=5)
_ANY = st.lists(_events(_KEYS, st.one_of(st.none(), _MEDIA, st.text(max_size=80))), max_size=5)
_PAYLOADS = st.one_of(
    _GOOD.map(lambda evs: encode_batch(batch(*evs))),
    _ANY.map(lambda evs: encode_batch(batch(*evs))),
    st.binary(max_size=2000),
    st.tuples(_ANY, st.integers(0, 60)).map(lambda pair: encode_batch(batch(*pair[0]))[: pair[1]]),
)
_SEQS = st.one_of(
    st.none(),  # the node's next one: applied
    st.builds(seq, st.integers(0, 6), st.sampled_from([1, 2])),  # gaps, duplicates, restarts
    st.integers(min_value=-2, max_value=(1 << 64) + 2),
)
FUZZ_MAX_PAYLOAD = 1500
"""The payload bound the fuzz runs under (patched), so that oversized payloads come up."""
FUZZ_MAX_ENTRIES = 10


def _decodes(payload: bytes) -> bool:
    try:
        decode_batch(payload)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["n1", "n2"]), _SEQS, _PAYLOADS),
        max_size=30,
    )
)
def test_any_payload_is_applied_or_counted_never_raised(
    payloads: list[tuple[str, int | None, bytes]],
) -> None:
    index = PrefixIndex(max_entries=FUZZ_MAX_ENTRIES)
    with patch("kvtier.fleet.index.MAX_PAYLOAD_BYTES", FUZZ_MAX_PAYLOAD):
        for node, given_number, payload in payloads:
            number = given_number
            if number is None:
                number = index.expected_seq(node) or seq(0, incarnation=1)
            rejected = index.stats().batches_rejected
            outcome = index.apply_payload(node, number, payload)
            assert isinstance(outcome, ApplyOutcome)
            if len(payload) > FUZZ_MAX_PAYLOAD or not _decodes(payload):
                assert outcome is ApplyOutcome.REJECTED
            if outcome is ApplyOutcome.REJECTED:
                assert index.stats().batches_rejected == rejected + 1
            stats = index.stats()
            assert stats.entries <= FUZZ_MAX_ENTRIES
            assert stats.entries == sum(info.entries for info in index.node_info())
            fresh = [info.node for info in index.node_info() if not info.stale]
            assert stats.keys == sum(len(index.holdings(name)) for name in fresh)
    stats = index.stats()
    counted = (
        stats.batches_applied
        + stats.batches_rejected
        + stats.gaps
        + stats.duplicates
        + stats.stale_batches
    )
    assert counted == len(payloads)
    # every entry: a key of at most 255 bytes (its object 33 more) and a slot of a small dict
    assert stats.memory_bytes <= FUZZ_MAX_ENTRIES * (255 + 33) + 2 * 4096
