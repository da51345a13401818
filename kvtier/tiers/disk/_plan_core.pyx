# cython: language_level=3, boundscheck=False, wraparound=False
"""A log store's per-record bookkeeping in compiled loops: the index's look-ups for a batch of
new records (`plan_new`) and its stores once they are durable (`apply_new`, log_commit.py's
`apply_new_arrays` the reference: ~120 us of array calls for 400 records on a quiet core),
a part's header entries (`pack_entries`), a group's records as the index takes them
(`placed_columns`: log_group.py's `placed`, ~43 us of conversions for 390 records on a
quiet core, ~8 us here) and the lane's placing of a run of records (`fit_run`).

`plan_new` is log_index.py's `LogIndex._plan_new` after its key rows are wide enough (the
numpy path there, `_plan_new_arrays`, is the fallback and the reference): per record its key
row, the slot that holds its key now (the dict of keys written since the open, each slot it
names confirmed against the slot's row; then the sorted key hashes, every candidate of an
equal hash confirmed in order), the last record per slot, the slots that lose a key, and a
block whose key a later block of the batch writes again dropped. The numpy path makes some
forty array calls a batch and a few C-level passes over the keys (a plan of 512 records:
~290 us); this pass ~160 us (the key rows, dicts and result arrays it still makes). The usual
batch, no slot and no key twice (both sorted and checked, `_distinct`), skips the dicts of
each slot's last record and each key's newest and the result arrays' gathers: a plan of
1,024 records 2.77 -> 1.28 M instructions (docs/BENCHMARKS.md, "The write row's CPU per
block, fourth round").

`pack_entries` writes a part's header entries and keys (log_format.py's `pack_group_into`;
`pack_group` the reference) straight into the head thread's buffer: one loop over the part's
columns where `pack_group` converts six lists to arrays and joins the keys (~18 us a part of
120 records on a quiet core, ~70 us on the loaded VM).

`fit_run` is log_group.py's `fit_run` once it has chosen how many records to look at (its
numpy path, `_fit_run_arrays`, the fallback and the reference): ~50 us of array calls a
run, some sixteen runs a 64 MiB call, against ~2 us here.

`call_columns` is log_group.py's `call_columns` (`call_columns_arrays` the fallback and the
reference): a write call's payload and key lengths and the running sums the lane reads each
run's bytes and directness from, in one pass over the call's buffers (~75 us of generator,
`map` and per-buffer checks a 1,024-block call on a quiet core before, and four array calls
a run for its bytes).

Built by `scripts/build-core` with the other core modules (`kvtier.compiled`); when it is
not built or not selected, log_index.py and log_group.py run the numpy paths.
`tests/test_disk_log_plan.py` checks that both plan the same on random batches (moves,
overwrites, keys written twice, hash collisions, stale plans) and place the same runs.
"""

import numpy as np

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy

from kvtier.arrays import has_duplicates, sorted_unique

cdef uint64_t _LENGTH_MIX = 0x9E3779B97F4A7C15ULL
cdef uint64_t _WORD_MIX = 0xFF51AFD7ED558CCDULL


cdef inline uint64_t _row_hash(const uint8_t *row, Py_ssize_t width, Py_ssize_t length) noexcept:
    """log_keys.py's `row_hashes` of one zero-padded row (native byte order, as numpy's
    view of the rows as uint64 reads them)."""
    cdef uint64_t value = <uint64_t> length * _LENGTH_MIX
    cdef uint64_t word
    cdef Py_ssize_t at
    for at in range(0, width, 8):
        memcpy(&word, row + at, 8)
        value ^= word
        value *= _WORD_MIX
        value ^= value >> 33
    return value


cdef inline bint _row_held(
    int64_t slot,
    const uint8_t *row,
    Py_ssize_t width,
    Py_ssize_t length,
    const uint8_t[:, ::1] index_keys,
    const uint8_t[::1] key_len,
    const int32_t[::1] region,
    const uint8_t[::1] codec,
    int tombstone,
) noexcept:
    """Whether `slot` holds a block whose key is `row` (`length` bytes): `_rows_held`."""
    return (
        region[slot] != -1
        and codec[slot] != tombstone
        and key_len[slot] == length
        and memcmp(&index_keys[slot, 0], row, width) == 0
    )


def plan_new(
    list keys,
    which_np,
    slot_np,
    codec_np,
    const uint8_t[:, ::1] index_keys,
    const uint8_t[::1] key_len,
    const int32_t[::1] region,
    const uint8_t[::1] codec,
    dict written,
    const uint64_t[::1] hashes,
    const int32_t[::1] hashed_slots,
    int tombstone,
    int header_bytes,
):
    """`LogIndex._plan_new`'s fields for the new records at positions `which` of a batch
    (`keys`: the batch's keys; `slot_of`, `codec_of`: the batch's columns), against the
    index's arrays (rows at least as wide as every key): (chosen, target, clear, rows,
    lengths, key_sizes, held, written) as `NewRecords` takes them."""
    cdef const int64_t[::1] which = which_np
    cdef const int64_t[::1] slot_of = slot_np
    cdef const int64_t[::1] codec_of = codec_np
    cdef Py_ssize_t count = which.shape[0]
    cdef Py_ssize_t width = index_keys.shape[1]
    cdef Py_ssize_t nhashes = hashes.shape[0]
    cdef Py_ssize_t i, j, lo, hi, mid, n_last, n_clear, length, n_keep
    cdef int64_t position, slot, found
    cdef uint64_t wanted
    cdef const uint8_t *row
    cdef bytes key_bytes
    rows_np = np.zeros((count, width), dtype=np.uint8)
    lengths_np = np.empty(count, dtype=np.int64)
    others_np = np.full(count, -1, dtype=np.int64)
    slots_np = np.empty(count, dtype=np.int64)
    block_hashes_np = np.empty(count, dtype=np.int64)
    cdef uint8_t[:, ::1] rows = rows_np
    cdef int64_t[::1] lengths = lengths_np
    cdef int64_t[::1] others = others_np
    cdef int64_t[::1] slots = slots_np
    cdef int64_t[::1] block_hashes = block_hashes_np
    cdef list picked = [None] * count
    cdef Py_ssize_t n_blocks = 0
    for i in range(count):
        key = keys[which[i]]
        picked[i] = key
        slots[i] = slot_of[which[i]]
        key_bytes = key if type(key) is bytes else bytes(key)
        length = len(key_bytes)
        if length > width:
            raise ValueError("plan_new: a key is longer than the index's rows")
        lengths[i] = length
        memcpy(&rows[i, 0], <const char *> key_bytes, length)
        if codec_of[which[i]] == tombstone:
            continue
        block_hashes[n_blocks] = hash(key)  # the dict look-up below reuses it (cached)
        n_blocks += 1
        row = &rows[i, 0]
        found = written.get(key, -1)
        if found >= 0 and not _row_held(found, row, width, length, index_keys, key_len,
                                        region, codec, tombstone):
            found = -1
        if found < 0 and nhashes:
            wanted = _row_hash(row, width, length)
            lo, hi = 0, nhashes
            while lo < hi:  # the first hash not below `wanted` (searchsorted, left)
                mid = (lo + hi) >> 1
                if hashes[mid] < wanted:
                    lo = mid + 1
                else:
                    hi = mid
            while lo < nhashes and hashes[lo] == wanted:
                slot = hashed_slots[lo]
                if _row_held(slot, row, width, length, index_keys, key_len, region, codec,
                             tombstone):
                    found = slot
                    break
                lo += 1
        others[i] = found
    cdef int64_t[::1] last = None
    cdef uint8_t[::1] keep
    # the usual batch has no slot and no key twice: every record the last of its slot and
    # its key's newest, the batch's own columns (no per-record dict); equal key hashes
    # only send it to the dict below, which compares the keys
    cdef bint slots_once = not has_duplicates(slots_np)
    cdef bint keys_once = not has_duplicates(block_hashes_np[:n_blocks])
    if slots_once and keys_once:
        n_last = count
        chosen_np = which_np.copy()
        target_np = slots_np
        clear_np = np.concatenate([others_np[others_np >= 0], slots_np])
        lengths_last = lengths_np
        rows_last = rows_np
    else:
        if slots_once:
            last_np = np.arange(count, dtype=np.int64)
        else:  # a slot written twice in the batch: its last record wins (a dict)
            last_of = {}
            for i in range(count):
                last_of[slots[i]] = i
            last_np = np.fromiter(last_of.values(), np.int64, len(last_of))
            last_np.sort()
        clear_np = np.concatenate([others_np[others_np >= 0], slots_np[last_np]])
        last = last_np
        n_last = last.shape[0]
        if not keys_once:  # maybe a key twice among the blocks: the dict compares them
            # a key written again later in the batch (into another slot) leaves this one
            newest = {}
            for i in range(count):
                if codec_of[which[i]] != tombstone:
                    newest[picked[i]] = i
            if len(newest) < n_blocks:  # rare: a key twice in the batch
                keep_np = np.ones(n_last, dtype=np.bool_)
                keep = keep_np.view(np.uint8)
                n_keep = n_last
                for j in range(n_last):
                    i = last[j]
                    if codec_of[which[i]] != tombstone and newest[picked[i]] > i:
                        keep[j] = 0
                        n_keep -= 1
                if n_keep < n_last:
                    last_np = last_np[keep_np]
                    last = last_np
                    n_last = n_keep
        chosen_np = which_np[last_np]
        target_np = slot_np[chosen_np]
        lengths_last = lengths_np[last_np]
        rows_last = rows_np[last_np]
    cdef dict new_written = {}
    cdef Py_ssize_t held = 0
    cdef int64_t[::1] target = target_np
    for j in range(n_last):
        i = j if last is None else last[j]
        if codec_of[which[i]] != tombstone:
            new_written[picked[i]] = target[j]
            held += 1
    return (
        chosen_np,
        target_np,
        sorted_unique(clear_np),
        rows_last,
        lengths_last,
        header_bytes + ((lengths_last + 7) & ~7),
        held,
        new_written,
    )


def fit_run(
    Py_ssize_t start,
    Py_ssize_t end,
    Py_ssize_t records,
    Py_ssize_t key_bytes,
    key_lens_np,
    lengths_np,
    Py_ssize_t count,
    Py_ssize_t region_bytes,
    Py_ssize_t page,
    Py_ssize_t entry_bytes,
    Py_ssize_t fixed,
):
    """log_group.py's `fit_run` once it has chosen `count`, the records it looks at (a
    part starting at `start` of its region, its payloads ending at `end`, `records` records
    and `key_bytes` of keys so far): (how many fit, their payload offsets), or None when
    they mix payloads of whole pages with others. One loop, stopping at the first record
    that does not fit, where the numpy path makes some fifteen array calls."""
    cdef const int64_t[::1] key_lens = key_lens_np
    cdef const int64_t[::1] lengths = lengths_np
    cdef Py_ssize_t i, whole = 0, taken = count
    cdef int64_t pos, stop, heads, used, length
    for i in range(count):
        if lengths[i] > 0 and lengths[i] % page == 0:
            whole += 1
    if 0 < whole < count:
        return None
    at_np = np.empty(count, dtype=np.int64)
    cdef int64_t[::1] at = at_np
    pos = -(-end // page) * page if whole else (end + 7) & ~7
    heads = fixed + key_bytes + records * entry_bytes
    for i in range(count):
        length = lengths[i]
        at[i] = pos
        stop = pos + length
        pos = stop if whole else pos + ((length + 7) & ~7)
        heads += entry_bytes + key_lens[i]
        used = start + (-(-heads // page) + -(-stop // page)) * page
        if used > region_bytes:
            taken = i
            break
    return taken, at_np[:taken]


def pack_entries(
    uint8_t[::1] out,
    Py_ssize_t at,
    list keys,
    list slot,
    list seq,
    list checksum,
    list offset,
    list length,
    list codec,
):
    """log_format.py's `pack_group`'s entries and keys (its `body + blob`) written into `out`
    from `at`, one loop over the part's columns (lists, as the lane builds them) where
    `pack_group` converts each column to an array and joins the keys: per record its entry
    (little-endian, `ENTRY`: slot, seq, checksum, offset, length, key_at, key_len, codec, a
    zero pad byte) then every key back to back; the bytes written. A value out of its
    field's range raises OverflowError (numpy's conversion did too); callers check the byte
    order (little-endian only)."""
    cdef Py_ssize_t count = len(keys)
    cdef Py_ssize_t i, key_at = 0, key_length
    cdef Py_ssize_t body = count * 40
    cdef uint8_t *entry
    cdef uint64_t value64
    cdef uint32_t value32
    cdef uint16_t value16
    cdef uint8_t value8
    cdef bytes key_bytes
    if (len(slot) != count or len(seq) != count or len(checksum) != count
            or len(offset) != count or len(length) != count or len(codec) != count):
        raise ValueError("pack_entries: the columns' lengths differ")
    for i in range(count):
        key = keys[i]
        key_bytes = key if type(key) is bytes else bytes(key)
        key_length = len(key_bytes)
        if key_length > 0xFFFF:
            raise OverflowError("pack_entries: a key longer than 65535 bytes")
        if at + body + key_at + key_length > out.shape[0]:
            raise ValueError("pack_entries: the buffer is too short")
        memcpy(&out[at + body + key_at], <const char *> key_bytes, key_length)
        entry = &out[at + i * 40]
        value64 = slot[i]
        memcpy(entry, &value64, 8)
        value64 = seq[i]
        memcpy(entry + 8, &value64, 8)
        value64 = checksum[i]
        memcpy(entry + 16, &value64, 8)
        value32 = offset[i]
        memcpy(entry + 24, &value32, 4)
        value32 = length[i]
        memcpy(entry + 28, &value32, 4)
        value32 = <uint32_t> key_at
        memcpy(entry + 32, &value32, 4)
        value16 = <uint16_t> key_length
        memcpy(entry + 36, &value16, 2)
        value8 = codec[i]
        entry[38] = value8
        entry[39] = 0
        key_at += key_length
    return body + key_at


def apply_new(
    const int64_t[::1] chosen,
    const int64_t[::1] target,
    const int64_t[::1] clear,
    const uint8_t[:, ::1] rows,
    const int64_t[::1] lengths,
    const int64_t[::1] key_sizes,
    const int64_t[::1] placed_region,
    const int64_t[::1] placed_offset,
    const int64_t[::1] placed_length,
    const int64_t[::1] placed_codec,
    const uint64_t[::1] placed_seq,
    const uint64_t[::1] placed_checksum,
    uint8_t[:, ::1] index_keys,
    uint8_t[::1] key_len,
    int32_t[::1] region,
    uint32_t[::1] offset,
    uint32_t[::1] length,
    uint8_t[::1] codec,
    uint64_t[::1] seq,
    uint64_t[::1] checksum,
    int64_t[::1] live,
    int tombstone,
    int header_bytes,
):
    """log_commit.py's `apply_new_arrays` (the reference and the fallback) in one loop a
    column: the slots of `clear` (distinct) lose their record (their region's live bytes
    less it), then per chosen record (`target`: distinct slots) its key row, key length and
    the batch's columns stored, its region's live bytes more; returns the blocks the
    clearing took (for the index's count). The numpy path makes some twenty array calls and
    two `np.add.at`s a batch; every position is checked against its array's bounds first, so
    a bad plan raises IndexError with the index unchanged. Stores cast as numpy's do."""
    cdef Py_ssize_t count = chosen.shape[0]
    cdef Py_ssize_t width = index_keys.shape[1]
    cdef Py_ssize_t slots = region.shape[0]
    cdef Py_ssize_t regions = live.shape[0]
    cdef Py_ssize_t records = placed_region.shape[0]
    cdef Py_ssize_t i, c, t, r
    cdef Py_ssize_t cleared = 0
    if (target.shape[0] != count or rows.shape[0] != count or lengths.shape[0] != count
            or key_sizes.shape[0] != count or rows.shape[1] != width
            or placed_offset.shape[0] != records or placed_length.shape[0] != records
            or placed_codec.shape[0] != records or placed_seq.shape[0] != records
            or placed_checksum.shape[0] != records):
        raise ValueError("apply_new: the plan's columns differ in length or width")
    for i in range(clear.shape[0]):
        if not 0 <= clear[i] < slots:
            raise IndexError("apply_new: a slot out of range")
        r = region[clear[i]]
        if r != -1 and not 0 <= r < regions:
            raise IndexError("apply_new: a region out of range")
    for i in range(count):
        c = chosen[i]
        if not 0 <= c < records or not 0 <= target[i] < slots:
            raise IndexError("apply_new: a record or slot out of range")
        if not 0 <= placed_region[c] < regions:
            raise IndexError("apply_new: a region out of range")
    for i in range(clear.shape[0]):
        t = clear[i]
        r = region[t]
        if r == -1:
            continue
        live[r] -= (
            header_bytes + ((<int64_t> key_len[t] + 7) & ~7) + ((<int64_t> length[t] + 7) & ~7)
        )
        if codec[t] != tombstone:
            cleared += 1
        region[t] = -1
    for i in range(count):
        c = chosen[i]
        t = target[i]
        memcpy(&index_keys[t, 0], &rows[i, 0], width)
        key_len[t] = <uint8_t> lengths[i]
        region[t] = <int32_t> placed_region[c]
        offset[t] = <uint32_t> placed_offset[c]
        length[t] = <uint32_t> placed_length[c]
        codec[t] = <uint8_t> placed_codec[c]
        seq[t] = placed_seq[c]
        checksum[t] = placed_checksum[c]
        live[placed_region[c]] += key_sizes[i] + ((placed_length[c] + 7) & ~7)
    return cleared


def placed_columns(list parts, Py_ssize_t page, bint checksums):
    """log_group.py's `placed` of written parts (its numpy path the reference): the keys and
    the columns (slot, region, offset from the region's start, length, codec, seq, checksum
    or zeros, moved_from) in one loop over each part's lists, where the numpy path chains
    and converts each column apart. A part's lists of unequal length raise ValueError; a
    value that does not fit its column (a checksum still None) raises as numpy's
    conversion does (TypeError, OverflowError)."""
    cdef Py_ssize_t count = 0, n = 0, i, size
    cdef int64_t base, part_region
    cdef list keys = []
    for part in parts:
        count += len(part.keys)
    slot_np = np.empty(count, dtype=np.int64)
    region_np = np.empty(count, dtype=np.int64)
    offset_np = np.empty(count, dtype=np.int64)
    length_np = np.empty(count, dtype=np.int64)
    codec_np = np.empty(count, dtype=np.int64)
    seq_np = np.empty(count, dtype=np.uint64)
    checksum_np = np.zeros(count, dtype=np.uint64)
    moved_np = np.empty(count, dtype=np.int64)
    cdef int64_t[::1] slot = slot_np
    cdef int64_t[::1] region = region_np
    cdef int64_t[::1] offset = offset_np
    cdef int64_t[::1] length = length_np
    cdef int64_t[::1] codec = codec_np
    cdef uint64_t[::1] seq = seq_np
    cdef uint64_t[::1] checksum = checksum_np
    cdef int64_t[::1] moved = moved_np
    cdef list slots, seqs, sums, offsets, lengths, codecs, moves
    for part in parts:
        size = len(part.keys)
        slots, seqs, sums = part.slot, part.seq, part.checksum
        offsets, lengths, codecs, moves = part.offset, part.length, part.codec, part.moved_from
        if (len(slots) != size or len(seqs) != size or len(sums) != size
                or len(offsets) != size or len(lengths) != size or len(codecs) != size
                or len(moves) != size):
            raise ValueError("placed_columns: a part's columns differ in length")
        keys.extend(part.keys)
        base = part.start + part.head_pages * page
        part_region = part.region
        for i in range(size):
            slot[n] = slots[i]
            region[n] = part_region
            offset[n] = base + <int64_t> offsets[i]
            length[n] = lengths[i]
            codec[n] = codecs[i]
            seq[n] = seqs[i]
            if checksums:
                checksum[n] = sums[i]
            moved[n] = moves[i]
            n += 1
    return (
        keys, slot_np, region_np, offset_np, length_np, codec_np, seq_np, checksum_np, moved_np
    )


def call_columns(list keys, list buffers, Py_ssize_t page, Py_ssize_t entry_bytes):
    """log_group.py's `call_columns`: per record of a write call its payload's bytes and its
    key's, the running sum of `record_bytes` (`ends[i]`: of the records before record i) and
    the running count of payloads O_DIRECT cannot write from their memory (`odd`; an empty
    one can, one that is not a contiguous buffer cannot, its bytes then its `nbytes`)."""
    cdef Py_ssize_t count = len(buffers)
    cdef Py_ssize_t i, length, key_len
    cdef Py_buffer view
    cdef bint aligned
    if len(keys) != count:
        raise ValueError("call_columns: keys and buffers differ in length")
    lengths_np = np.empty(count, dtype=np.int64)
    key_lens_np = np.empty(count, dtype=np.int64)
    ends_np = np.empty(count + 1, dtype=np.int64)
    odd_np = np.empty(count + 1, dtype=np.int64)
    cdef int64_t[::1] lengths = lengths_np
    cdef int64_t[::1] key_lens = key_lens_np
    cdef int64_t[::1] ends = ends_np
    cdef int64_t[::1] odd = odd_np
    ends[0] = 0
    odd[0] = 0
    for i in range(count):
        buffer = buffers[i]
        try:
            PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE)
        except (BufferError, TypeError, ValueError):
            length = buffer.nbytes
            aligned = False
        else:
            length = view.len
            aligned = length == 0 or (length % page == 0 and (<size_t> view.buf) % page == 0)
            PyBuffer_Release(&view)
        key_len = len(keys[i])
        lengths[i] = length
        key_lens[i] = key_len
        ends[i + 1] = ends[i] + entry_bytes + ((key_len + 7) & ~7) + ((length + 7) & ~7)
        odd[i + 1] = odd[i] + (0 if aligned else 1)
    return lengths_np, key_lens_np, ends_np, odd_np
