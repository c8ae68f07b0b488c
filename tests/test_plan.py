"""The launch policy (_plan): every shape gets a legal launch that covers every column once."""

import pytest

import model_new
from model_new import _plan

SHAPES = [(0, 7), (1, 1), (1, 4096), (3, 5), (4096, 129), (32768, 4096), (4096, 32000), (8192, 50257),
          (8192, 128256), (16, 256000), (1000000, 10), (65536, 1000), (2, 3 * 2**30), (131, 777777), (1, 2**24)]


@pytest.mark.parametrize("rows, cols", SHAPES)
@pytest.mark.parametrize("elem_bytes", [4, 2])
@pytest.mark.parametrize("sms", [132, 108, 1, 1000])
@pytest.mark.parametrize("evict_first", [True, False], ids=["evict-first", "plain"])
def test_plan_is_legal(rows, cols, elem_bytes, sms, evict_first):
    p = _plan(rows, cols, cols, elem_bytes, sms, evict_first)
    per_vec = 16 // elem_bytes
    assert 1 <= p.grid <= max(1, sms * model_new._CTAS_PER_SM)
    assert p.group & (p.group - 1) == 0 and 1 <= p.group <= (model_new._ONE_ROW_THREADS if p.one_row else model_new._THREADS)
    assert p.seg_len % per_vec == 0 and p.seg_len <= model_new._MAX_SEG
    # segments tile the row exactly: none empty, none missing; the last CTA can stage a row's partials
    assert (p.splits - 1) * p.seg_len < cols <= p.splits * p.seg_len
    assert p.splits <= model_new._SEG_SLAB
    # items per CTA fit in a 32-bit count
    assert rows * p.splits // p.grid < 2**31
    if p.tile_rows:  # a tile's stretch fits the CTA's one batch of vectors, its targets one slot each
        assert p.splits == 1 and p.group <= 32
        assert ((p.tile_rows - 1) * cols + cols) * elem_bytes <= model_new._TILE_BYTES
        assert p.tile_rows <= model_new._THREADS * model_new._TILE_TARGETS
    if p.one_row:  # one CTA of whole warps, each thread with at most a batch of the row's whole vectors
        assert rows == 1 and p.grid == p.chunks == p.splits == 1 and p.tile_rows == p.batch_rows == 0
        assert p.group >= 32 and p.group * model_new._BATCH >= cols // per_vec
    if p.batch_rows:  # whole rows of whole vectors fill a batch exactly, and every CTA gets several
        assert p.tile_rows == 0 and p.splits == 1 and p.batch_rows in (1, 2)
        assert p.batch_rows * cols * elem_bytes == model_new._ROW_BATCH_VECS * 16
        assert p.chunks >= model_new._ROW_BATCH_MIN_CHUNKS * p.grid


def test_headline_shape_fills_the_gpu_with_whole_rows():
    for elem_bytes, batch_rows in [(4, 1), (2, 2)]:  # a 16 KB batch: one fp32 row, two 16-bit rows
        for evict_first in (False, True):
            p = _plan(32768, 4096, 4096, elem_bytes, 132, evict_first)
            assert p.splits == 1 and p.tile_rows == 0 and p.grid == 132 * model_new._CTAS_PER_SM
            assert p.batch_rows == batch_rows and p.chunks == 32768 // batch_rows


@pytest.mark.parametrize("rows, cols, stride, elem_bytes, aligned, batch_rows", [
    (32768, 4096, 4096, 4, True, 1), (32768, 2048, 2048, 4, True, 2), (32768, 8192, 8192, 2, True, 1),
    (4001, 4096, 4104, 2, True, 2),   # padded rows on the 16-byte grid, and a last chunk of one row
    (32768, 4096, 4096, 4, False, 0),  # the first logit off the 16-byte grid
    (32768, 4096, 4099, 4, True, 0),   # rows off the 16-byte grid
    (32768, 4100, 4100, 4, True, 0),   # rows that do not fill a batch exactly
    (32768, 1024, 1024, 4, True, 0),   # four rows a batch: tiles
    (32768, 16384, 16384, 2, True, 0),  # a row of two batches
    (1000, 4096, 4096, 4, True, 0),    # fewer than 4 batches per CTA
])
def test_row_batches_where_rows_fill_a_batch(rows, cols, stride, elem_bytes, aligned, batch_rows):
    for evict_first in (False, True):
        assert _plan(rows, cols, stride, elem_bytes, 132, evict_first, aligned).batch_rows == batch_rows


@pytest.mark.parametrize("cols, elem_bytes", [(4096, 2), (4096, 4), (2048, 4), (8192, 2), (1800, 4)])
def test_evict_first_rows_take_one_batch_per_thread(cols, elem_bytes):
    # Off the 16-byte grid, so that rows that fill a batch exactly stream through registers too.
    plain, evict_first = (_plan(32768, cols, cols, elem_bytes, 132, ef, False) for ef in (False, True))
    vecs = -(-cols * elem_bytes // 16)
    assert plain.group * model_new._VECS_PER_THREAD >= vecs > plain.group * model_new._VECS_PER_THREAD // 2
    assert evict_first.group == 2 * plain.group  # each thread one batch of the row
    assert evict_first.group * model_new._BATCH >= vecs > evict_first.group * model_new._BATCH // 2
    # rows longer than a CTA's batch: a whole CTA per row either way
    assert _plan(4096, 32000, 32000, 2, 132, True).group == _plan(4096, 32000, 32000, 2, 132, False).group == 256


@pytest.mark.parametrize("cols, elem_bytes, evict_first, group", [
    (4100, 4, True, 128), (4100, 4, False, 64),  # 1025 vectors: 4 or 5 a thread of 8 at 256 threads
    (2052, 4, True, 64), (4104, 2, True, 64), (1100, 4, True, 32), (2200, 2, False, 16),
    (5600, 4, True, 128),                        # 1400 vectors: 68% of 256 threads' slots
    (7000, 4, True, 256), (6560, 4, True, 256),  # one batch fills 85% and 80%: 80% is enough
    (12000, 4, False, 256),                      # two batches fill 73%: 70% is enough
    (10000, 4, True, 256), (16400, 4, True, 256),  # longer than a round of 256 threads: left whole
])
def test_rows_that_leave_slots_empty_get_half_the_group(cols, elem_bytes, evict_first, group):
    p = _plan(32768, cols, cols, elem_bytes, 132, evict_first)
    assert p.splits == 1 and not p.tile_rows and not p.batch_rows and p.group == group, p
    vecs = -(-cols * elem_bytes // 16)
    per_thread = model_new._BATCH if evict_first else model_new._VECS_PER_THREAD
    whole = min(model_new._THREADS, model_new._pow2_at_least(-(-vecs // per_thread)))
    assert p.group in (whole, whole // 2)
    if p.group < whole:  # halved: every thread's first batch is full
        assert vecs >= p.group * model_new._BATCH and vecs < model_new._MIN_SLOT_FILL[per_thread] * per_thread * whole


def kernel_batches(end, group):
    """reduce_segment's batches for a body ending at vector `end` (lead included): the last batch's
    first vector, and whether that batch rides along with the one before it."""
    batch = model_new._BATCH * group
    tail_batch = (end - 1) & -batch
    return tail_batch, tail_batch > 0 and end - tail_batch <= model_new._SHORT_TAIL * group


@pytest.mark.parametrize("per_vec", [4, 8])
@pytest.mark.parametrize("group", [1, 2, 32, 64, 128, 256])
def test_lead_256_only_where_no_item_changes_its_batches(per_vec, group):
    """_lead_256 against every start an item can have: each element offset from the 16-byte grid (its
    head) and each lead of 0 to 15 vectors. Evict-first loads take the lead in groups of 64 or more
    only where every item has two batches or more and keeps them, as many and riding alike, whatever
    its start; plain loads in every group but a lone thread."""
    batch = model_new._BATCH * group
    # lengths around each batch's end and around where a last batch stops riding (half a batch in)
    lengths = sorted({n for k in range(1, 6) for half in (0, batch // 2) for d in range(-130, 131, 3)
                      if (n := (k * batch + half) * per_vec + d) > 0} | set(range(1, 3 * per_vec * 16 + 1, 7)))
    for length in lengths:
        starts = [(length - head) // per_vec for head in range(per_vec)]  # whole vectors in the body
        keeps = all(kernel_batches(nvec + lead, group) == kernel_batches(nvec, group) and kernel_batches(nvec, group)[0] > 0
                    for nvec in starts for lead in range(16))
        assert model_new._lead_256(group, [length], per_vec, True) == (group >= 64 and keeps), length
        assert model_new._lead_256(group, [length], per_vec, False) == (group > 1), length
    # segments: every length must keep its batches
    keep, change = (batch + 3 * batch // 4) * per_vec, batch * per_vec  # 1.75 batches; one exactly
    if group >= 64:
        assert model_new._lead_256(group, [keep, keep], per_vec, True)
        assert not model_new._lead_256(group, [keep, change], per_vec, True)


@pytest.mark.parametrize("rows, cols, elem_bytes, lead", [
    (4096, 32001, 2, True), (3000, 40001, 2, True), (20000, 6001, 2, True), (13421, 5001, 4, True),
    (8192, 16385, 2, False),  # 2047 or 2048 vectors: the lead would add a second batch
    (16000, 7001, 2, False),  # one batch
    (53687, 2500, 2, False),  # groups of 32
    (4096, 32000, 2, True),   # on the 256-byte grid: a lead of 0, which the kernel works out per row
])
def test_evict_first_rows_counted_from_the_256_byte_grid(rows, cols, elem_bytes, lead):
    p = _plan(rows, cols, cols, elem_bytes, 132, True)
    assert p.splits == 1 and not p.tile_rows and not p.batch_rows and p.lead_256 == lead, p
    assert _plan(rows, cols, cols, elem_bytes, 132, False).lead_256  # plain loads: always


@pytest.mark.parametrize("rows, cols", SHAPES)
@pytest.mark.parametrize("elem_bytes", [4, 2])
@pytest.mark.parametrize("evict_first", [True, False], ids=["evict-first", "plain"])
def test_chunks_cover_the_items_and_fill_the_grid(rows, cols, elem_bytes, evict_first):
    p = _plan(rows, cols, cols, elem_bytes, 132, evict_first)
    per_chunk = p.batch_rows or p.tile_rows or model_new._THREADS // p.group * p.rounds  # items per chunk
    items = rows * p.splits
    assert (p.chunks - 1) * per_chunk < items <= p.chunks * per_chunk or items == p.chunks == 0
    # every CTA that fits (evict-first tiles: fewer per SM), unless there are fewer chunks than
    # that: the claims balance the rest
    ctas = {model_new._CTAS_PER_SM} | ({model_new._EVICT_FIRST_TILE_CTAS} if evict_first and p.tile_rows else set())
    assert p.grid in {max(1, min(132 * c, p.chunks)) for c in ctas}
    # the claim counter is 32-bit and runs at most one claim per CTA past the last chunk
    assert p.chunks + 2 * p.grid < 2**32


def test_few_rows_get_more_threads_while_each_cta_has_an_sm():
    for evict_first in (False, True):  # one row: as many threads as hold one batch of it each
        assert _plan(1, 4096, 4096, 2, 132, evict_first).group * model_new._BATCH * 16 == 4096 * 2
    p = _plan(64, 5000, 5000, 4, 132, False)
    assert p.group == 256 and p.grid == 64
    for rows in (300, 1000, 2000, 32768):  # bigger groups would put more CTAs than SMs
        p = _plan(rows, 4096, 4096, 2, 132, False, False)  # off the 16-byte grid: rows in registers
        assert p.group == 256 or -(-rows // (model_new._THREADS // (2 * p.group))) > 132
        assert p.group == _plan(32768, 4096, 4096, 2, 132, False, False).group or p.grid <= 132


@pytest.mark.parametrize("elem_bytes", [4, 2])
def test_a_lone_row_of_up_to_128_kb_has_its_own_kernel(elem_bytes):
    per_vec = 16 // elem_bytes
    limit = model_new._ONE_ROW_THREADS * model_new._BATCH * per_vec  # 128 KB of whole vectors
    assert limit * elem_bytes == 128 << 10
    for cols, threads in [(1, 32), (3, 32), (4096, 4096 // per_vec // model_new._BATCH), (4099, 4096 // per_vec // model_new._BATCH),
                          (limit // 2 + per_vec, model_new._ONE_ROW_THREADS), (limit, model_new._ONE_ROW_THREADS)]:
        for aligned in (True, False):  # wherever it starts: its elements outside whole vectors are one per thread
            p = _plan(1, cols, cols, elem_bytes, 132, True, aligned)
            assert p.one_row and p.group == threads, (cols, p)
    assert not _plan(1, limit + per_vec, limit + per_vec, elem_bytes, 132, True).one_row  # longer: split
    assert _plan(1, limit + per_vec, limit + per_vec, elem_bytes, 132, True).splits > 1
    assert not _plan(2, 4096, 4096, elem_bytes, 132, True).one_row  # two rows: the mean of two losses


def test_few_long_rows_are_split_across_ctas():
    p = _plan(16, 256000, 256000, 4, 132, False)
    assert p.splits >= 8 and p.grid >= 128


def test_short_rows_are_staged_in_tiles_that_fill_the_gpu():
    p = _plan(1000000, 10, 10, 2, 132, False)  # 20-byte rows: a thread per row, tiles of whole sweeps
    assert p.group == 1 and p.tile_rows % model_new._THREADS == 0 and p.chunks > 132 * model_new._CTAS_PER_SM
    p = _plan(65536, 1000, 1000, 2, 132, False)  # 2000-byte rows: 16 to a 32 KB tile, 16 threads each
    assert p.tile_rows == 16 and p.group == 16 and p.chunks == 4096
    p = _plan(4096, 129, 129, 4, 132, False)  # a small problem: tiles shrink until every CTA has one
    assert p.grid == p.chunks > 0.9 * 132 * model_new._CTAS_PER_SM and p.group * p.tile_rows <= model_new._THREADS
    assert _plan(1, 4096, 4096, 2, 132, False).tile_rows == 0  # 8 KB: too long to stage


def test_tiles_of_many_rows_take_whole_sweeps_that_even_out_the_ctas():
    """A thread per row, a row per sweep: tiles of whole sweeps (256 rows), as many as leave the
    busiest of the 396 CTAs the fewest sweeps in all, the larger tile on a tie."""
    sweep = model_new._THREADS
    assert sweep == 256 and model_new._CTAS_PER_SM == 3  # the figures below
    for rows, cols, elem_bytes, tile_rows in [
        (1000000, 10, 2, 2 * sweep),  # 1024 rows fit: 977 tiles, 3 to the busiest CTA, 12 sweeps; 1954 tiles of 2: 10
        (1000000, 10, 4, 2 * sweep),  # 819 fit: 1303 tiles of 3 sweeps, 4 to a CTA, 12; 1954 of 2: 10
        (4000000, 10, 2, 4 * sweep),  # 3907 tiles of 4 sweeps, 10 to a CTA, 40: nothing smaller has fewer
        (500000, 31, 2, sweep),       # 528 fit: 977 tiles of 2 sweeps, 3 to a CTA, 6; 1954 of 1: 5
        (300000, 20, 2, 3 * sweep),   # one tile a CTA: 391 tiles of 3 sweeps
        (2000000, 24, 4, sweep),      # rows of 6 vectors (the longer rows' kernels): 341 fit, one sweep
    ]:
        p = _plan(rows, cols, cols, elem_bytes, 132, False)
        assert p.group == 1 and p.tile_rows == tile_rows and p.chunks == -(-rows // tile_rows), (rows, cols, p)
    assert _plan(100000, 10, 10, 4, 132, False).tile_rows == 253  # fewer rows than threads per CTA: one tile each


@pytest.mark.parametrize("elem_bytes", [4, 2])
def test_gpu_test_shapes_take_the_path_they_test(elem_bytes):
    from cases import PATHS
    assert _plan(*PATHS["tiled"], PATHS["tiled"][1], elem_bytes, 132, False).tile_rows > 0
    assert PATHS["tiled"][1] >= 4 * 16 // elem_bytes  # the kernels of longer rows
    assert _plan(*PATHS["tiled short"], PATHS["tiled short"][1], elem_bytes, 132, False).tile_rows > 0
    assert PATHS["tiled short"][1] < 4 * 16 // elem_bytes  # the short rows' kernels (kShortRowElems)
    assert _plan(*PATHS["tiled short"], PATHS["tiled short"][1], elem_bytes, 132, False).group > 1
    for path in ("tiled short, thread per row", "tiled short, thread per row, odd width"):
        rows, cols = PATHS[path]
        p = _plan(rows, cols, cols, elem_bytes, 132, False)
        assert cols < 4 * 16 // elem_bytes and p.group == 1 and p.tile_rows > model_new._THREADS  # rows a thread
    assert PATHS["tiled short, thread per row"][1] % 2 == 0 and PATHS["tiled short, thread per row, odd width"][1] % 2
    p = _plan(*PATHS["registers"], PATHS["registers"][1], elem_bytes, 132, False)
    assert p.tile_rows == p.batch_rows == 0 and not p.one_row
    assert _plan(*PATHS["row batches"], PATHS["row batches"][1], elem_bytes, 132, False).batch_rows > 0
    assert _plan(*PATHS["one row"], PATHS["one row"][1], elem_bytes, 132, False).one_row
    assert _plan(4001, 4096, 4096, elem_bytes, 132, False).batch_rows > 0  # in SHAPES: a partial last chunk
    for cols in (12, 64, 5000):  # special_rows
        assert (_plan(8, cols, cols, elem_bytes, 132, False).tile_rows > 0) == (cols < 5000)


def test_evict_first_tiles_of_long_enough_rows_run_fewer_ctas():
    fewer, every = 132 * model_new._EVICT_FIRST_TILE_CTAS, 132 * model_new._CTAS_PER_SM
    assert fewer < every
    for elem_bytes in (4, 2):  # 2000- and 4000-byte rows
        assert _plan(65536, 1000, 1000, elem_bytes, 132, True).grid == fewer
        assert _plan(65536, 1000, 1000, elem_bytes, 132, False).grid == every
    assert _plan(262144, 250, 250, 2, 132, True).grid == every  # 500-byte rows: tiles of much arithmetic
    assert _plan(1000000, 10, 10, 4, 132, True).grid == every
    assert _plan(32768, 4096, 4096, 2, 132, True).grid == every  # row batches
    assert _plan(32768, 4096, 4096, 2, 132, True, False).grid == every  # rows in registers
    p = _plan(4096, 129, 129, 4, 132, True)  # still one wave: tiles of 16 rows, not 11
    assert p.grid == p.chunks <= fewer and p.tile_rows == 16
    p = _plan(8192, 300, 300, 4, 132, True)  # fewer CTAs would need a wave and a bit: every CTA
    assert p == _plan(8192, 300, 300, 4, 132, False) and p.grid == p.chunks > fewer


def test_rows_far_apart_stream_through_registers():
    assert _plan(300, 1000, 1003, 4, 132, False).tile_rows > 0  # a small gap is read along with the rows
    assert _plan(300, 1000, 10000, 4, 132, False).tile_rows == 0  # a large one is not
    assert _plan(100, 10, 0, 4, 132, False).tile_rows > 0  # every row the same memory (an expanded tensor)


def test_long_rows_are_claimed_a_round_at_a_time_and_short_rows_are_shared_out():
    long_rows = _plan(32768, 4096, 4096, 4, 132, False, False)  # 64 KB a round: claims balance the end
    assert long_rows.rounds == 1 and long_rows.chunks > 8 * long_rows.grid
    short = _plan(1000000, 10, 4096, 4, 132, False)  # short rows far apart: 10 KB a round, one chunk per CTA
    assert short.tile_rows == 0 and short.rounds > 1 and short.chunks == short.grid


@pytest.mark.parametrize("rows, cols", [(1, 3), (5, 4096), (70000, 3), (70000, 4096), (5, 300000), (32768, 4096)])
def test_workspace_layouts_are_aligned(rows, cols):
    p = _plan(rows, cols, cols, 4, 132, False)
    exact_off, seg_off, nbytes = model_new._workspace_layout(p, rows)
    # The counters first (16 bytes), then the exact sum's words, read 16 bytes at a time.
    assert exact_off == 16 and model_new._EXACT_WORDS % 2 == 0
    assert seg_off >= exact_off + 8 * model_new._EXACT_WORDS and seg_off % 16 == 0
    assert nbytes == seg_off + (16 * rows * p.splits if p.splits > 1 else 0)


def test_evict_first_loads_for_reads_of_a_few_l2_sizes_and_16_bit_row_batches():
    l2 = 50 << 20  # the H100's L2
    limit = model_new._EVICT_FIRST_L2S * l2
    for elem_bytes in (4, 2):
        assert model_new._evict_first(0, l2, elem_bytes, False) and model_new._evict_first(limit, l2, elem_bytes, False)
        assert not model_new._evict_first(limit + 1, l2, elem_bytes, False)
    assert model_new._evict_first(65536 * 1000 * 2, l2, 2, False)      # 125 MiB of bf16: evict-first measured 7% faster
    assert model_new._evict_first(32768 * 4096 * 2, l2, 2, True)       # 256 MiB of bf16: 3 us faster
    assert not model_new._evict_first(5120 * 32000 * 2, l2, 2, False)  # 312 MiB: 0.1-0.3 us slower
    assert not model_new._evict_first(32768 * 4096 * 4, l2, 4, True)   # 512 MiB of fp32 row batches: 2 us slower
    assert model_new._evict_first(65536 * 4096 * 2, l2, 2, True)       # 512 MiB of bf16 row batches: 3 us faster
    assert model_new._evict_first(65536 * 8192 * 2, l2, 2, True)       # 1 GiB of them: 5.5 us faster


# The memory systems the policy tells apart, as torch reports them (memory clock in kHz, bus in bits).
H100 = dict(multi_processor_count=132, L2_cache_size=50 << 20, memory_clock_rate=2619000, memory_bus_width=5120)
H200 = dict(multi_processor_count=132, L2_cache_size=60 << 20, memory_clock_rate=3201000, memory_bus_width=6016)


def test_fast_memory_is_bandwidth_per_sm():
    import types
    assert not model_new._fast_memory(types.SimpleNamespace(**H100))  # 3.35 TB/s: 25 GB/s per SM
    assert model_new._fast_memory(types.SimpleNamespace(**H200))      # 4.8 TB/s: 36 GB/s per SM
    # A100 80GB (2.0 TB/s over 108 SMs): not fast; the same H200 memory over half the SMs: fast.
    assert not model_new._fast_memory(types.SimpleNamespace(multi_processor_count=108, memory_clock_rate=1593000,
                                                            memory_bus_width=5120, L2_cache_size=40 << 20))
    assert model_new._fast_memory(types.SimpleNamespace(**dict(H200, multi_processor_count=66)))
    # A torch that does not report the memory: the rules the H100 was measured with.
    assert not model_new._fast_memory(types.SimpleNamespace(multi_processor_count=132, L2_cache_size=60 << 20))


def plan_on(monkeypatch, gpu, rows, cols, elem_bytes, aligned=True):
    import types
    monkeypatch.setattr(model_new, "_device_properties", lambda _: types.SimpleNamespace(**gpu))
    model_new._plan_on.cache_clear()
    plan = model_new._plan_on(0, rows, cols, cols, elem_bytes, aligned)
    model_new._plan_on.cache_clear()
    return plan


def test_fast_memory_takes_row_batches_up_to_a_few_l2_sizes(monkeypatch):
    limit = model_new._FAST_MEMORY_L2S * H200["L2_cache_size"]
    for cols, elem_bytes in ((4096, 4), (4096, 2), (2048, 4), (8192, 2)):
        rows = limit // (cols * elem_bytes)
        plan, evict_first = plan_on(monkeypatch, H200, rows, cols, elem_bytes)
        assert plan.batch_rows and evict_first, (cols, elem_bytes)
        plan, evict_first = plan_on(monkeypatch, H200, rows + 1, cols, elem_bytes)  # past it: rows in registers
        assert not plan.batch_rows and not plan.tile_rows and evict_first == (elem_bytes == 2), (cols, elem_bytes)
        # The H100 takes both in row batches, and reads 16-bit rows evict-first at any size.
        plan, evict_first = plan_on(monkeypatch, H100, rows + 1, cols, elem_bytes)
        assert plan.batch_rows and evict_first
    plan, evict_first = plan_on(monkeypatch, H200, 32768, 4096, 4)  # 512 MiB: 133.6 us against 161.3
    assert not plan.batch_rows and not evict_first


def test_fast_memory_reads_evict_first_up_to_6_l2_sizes_but_fp32_rows_outside_tiles_up_to_3(monkeypatch):
    six, three = (n * H200["L2_cache_size"] for n in (model_new._EVICT_FIRST_L2S, model_new._FAST_MEMORY_L2S))
    for cols, elem_bytes, limit, tiles in [(32000, 2, six, False), (32000, 4, three, False),
                                           (4104, 4, three, False), (1000, 2, six, True), (1000, 4, six, True)]:
        rows = limit // (cols * elem_bytes)
        plan, evict_first = plan_on(monkeypatch, H200, rows, cols, elem_bytes)
        assert evict_first and bool(plan.tile_rows) == tiles, (cols, elem_bytes)
        assert not plan_on(monkeypatch, H200, rows + 1, cols, elem_bytes)[1], (cols, elem_bytes)


def test_fast_memory_keeps_two_batches_per_item_and_every_cta_with_evict_first_loads(monkeypatch):
    # H200, read evict-first: 32768 x 4096 bf16 in registers, 77.8 us with 16 vectors a thread and
    # 87.1 with 8; 65536 x 1000 bf16 in tiles, 44.9 us on 3 CTAs per SM and 50.4 on 2.
    h100, _ = plan_on(monkeypatch, H100, 32768, 4104, 2)
    h200, evict_first = plan_on(monkeypatch, H200, 32768, 4104, 2)
    assert evict_first and h200.group == h100.group // 2 == _plan(32768, 4104, 4104, 2, 132, False).group
    for gpu, ctas in ((H100, model_new._EVICT_FIRST_TILE_CTAS), (H200, model_new._CTAS_PER_SM)):
        plan, evict_first = plan_on(monkeypatch, gpu, 65536, 1000, 2)
        assert plan.tile_rows and evict_first and plan.grid == 132 * ctas
