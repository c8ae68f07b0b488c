"""The launch policy: the kernel family first, then the kind of load, then the family's shape.
Each family's own shape rules are tested beside its GPU cases (test_rows.py, test_tiles.py,
test_row_batches.py, test_one_row.py); here, what holds for every plan."""
import pytest

from cases import PATHS
from crossent import dispatch, params, policy
from crossent.constants import (CTAS_PER_SM, ELEMENT_SWEEPS, EXACT_WORDS, MAX_SEG, ONE_ROW, ONE_ROW_THREADS,
                                PAIR_SWEEPS, ROW_BATCHES, ROWS, STREAMED, THREADS, TILES, VECTOR_SWEEPS)
from plans import GPU_PLANS, GPUS, H100, SHAPES, gpu, plan, plan_on

FAMILIES = {ROWS: "rows", TILES: "tiles", ROW_BATCHES: "row batches", ONE_ROW: "one row"}


@pytest.mark.parametrize("rows, cols", SHAPES)
@pytest.mark.parametrize("elem_bytes", [4, 2])
@pytest.mark.parametrize("sms", [132, 108, 1, 1000])
@pytest.mark.parametrize("evict_first", [True, False], ids=["evict-first", "plain"])
def test_every_plan_is_legal(rows, cols, elem_bytes, sms, evict_first):
    p = plan(rows, cols, elem_bytes, evict_first, on=gpu(sms))
    assert p.family in FAMILIES and p.evict_first == evict_first
    assert 1 <= p.grid <= max(1, policy._max_grid(p.family, gpu(sms)))
    threads = ONE_ROW_THREADS if p.family == ONE_ROW else THREADS
    assert p.group & (p.group - 1) == 0 and 1 <= p.group <= threads
    # the chunks cover every item (a row, or a segment of one) once
    per_chunk = {ROW_BATCHES: p.batch_rows, TILES: p.tile_rows, ONE_ROW: 1}.get(p.family, THREADS // p.group * p.rounds)
    items = rows * p.splits
    assert (p.chunks - 1) * per_chunk < items <= p.chunks * per_chunk or items == p.chunks == 0
    # the claim counter is 32-bit and runs at most one claim per CTA past the last chunk
    assert p.chunks + 2 * p.grid < 2**32
    # only rows in registers are split
    assert p.splits == 1 or p.family == ROWS


def test_the_family_is_the_first_that_takes_the_problem():
    """_family's table, a problem each, and the next family down where one condition fails."""
    cases = [
        ((1, 4096, 4096, 4, 0), ONE_ROW),            # a lone row of up to 128 KB
        ((1, 32768, 32768, 4, 0), ONE_ROW),          # 128 KB exactly
        ((1, 32772, 32772, 4, 0), ROWS),             # past it: split into segments
        ((32768, 4096, 4096, 4, 0), ROW_BATCHES),    # one fp32 row fills a CTA batch
        ((32768, 4096, 4096, 2, 0), ROW_BATCHES),    # two 16-bit rows
        ((32768, 4096, 4096, 4, 4), ROWS),           # off the 16-byte grid: not row batches
        ((32768, 1024, 1024, 4, 0), TILES),          # four rows a batch: short rows in tiles
        ((65536, 1000, 1000, 2, 0), TILES),
        ((300, 1000, 10000, 4, 0), ROWS),            # rows far apart: not staged in tiles
        ((4096, 32000, 32000, 2, 0), ROWS),
    ]
    for (rows, cols, stride, elem_bytes, offset), family in cases:
        got = policy._family(rows, cols, stride, elem_bytes, H100, offset)
        assert got == family, (rows, cols, stride, elem_bytes, offset, FAMILIES[got])


@pytest.mark.parametrize("rows, cols", SHAPES)
@pytest.mark.parametrize("elem_bytes", [4, 2])
def test_class_weights_take_rows_in_registers_where_row_batches_would_and_fit_a_tiles_table(rows, cols, elem_bytes):
    """Weighted, the plan is the same but for row batches, whose merge would wait for each row's
    weight ("Options"): rows in registers take those. Tiles hold every class's weight in shared
    memory, so every row a tile takes fits that table."""
    unweighted = policy.plan_launch(rows, cols, cols, elem_bytes, H100)
    weighted = policy.plan_launch(rows, cols, cols, elem_bytes, H100, weighted=True)
    if unweighted.family == ROW_BATCHES:
        assert weighted.family == ROWS
        assert weighted == policy._shape(ROWS, rows, cols, cols, elem_bytes, H100, 0, weighted.evict_first)
    else:
        assert weighted == unweighted
    if unweighted.family == TILES:
        assert cols * elem_bytes <= policy._OPTIONS_SHARED_BYTES[TILES]


@pytest.mark.parametrize("rows, cols", SHAPES)
@pytest.mark.parametrize("elem_bytes", [4, 2])
def test_label_smoothing_takes_tiles_or_whole_rows_with_evict_first_loads(rows, cols, elem_bytes):
    """Only those compute label smoothing's gaps ("Options"): never one row, row batches or split
    rows, and rows in registers read evict-first."""
    if cols > MAX_SEG:
        return  # the dispatch refuses it
    p = policy.plan_launch(rows, cols, cols, elem_bytes, H100, smoothed=True)
    assert p.family in (TILES, ROWS) and p.splits == 1
    assert p.family == TILES or p.evict_first
    unsmoothed = policy.plan_launch(rows, cols, cols, elem_bytes, H100)
    if unsmoothed.family == TILES:
        assert p == unsmoothed


def test_weighted_tiles_never_take_rows_longer_than_their_class_weight_table():
    """Rows that overlap in memory (a stride under C, 0 for an expanded tensor) pass _tile_fit at up
    to a whole tile; with class weights they go to rows in registers instead."""
    for cols in range(1, 9000, 37):
        for stride in (0, 1, cols // 2, cols, cols + 3):
            for elem_bytes in (4, 2):
                family = policy._family(100000, cols, stride, elem_bytes, H100, 0, weighted=True)
                if family == TILES:
                    assert cols * elem_bytes <= policy._OPTIONS_SHARED_BYTES[TILES], (cols, stride)
    assert policy._family(2000, 4000, 0, 4, H100, 0) == TILES  # unweighted: a tile's worth
    assert policy._family(2000, 4000, 0, 4, H100, 0, weighted=True) == ROWS


@pytest.mark.parametrize("elem_bytes", [4, 2])
def test_the_gpu_test_shapes_take_the_path_they_test(elem_bytes):
    """cases.PATHS names a shape for each kernel the policy can choose; each takes it, in every dtype."""
    p = {name: plan(rows, cols, elem_bytes, False) for name, (rows, cols) in PATHS.items()}
    per_vec = 16 // elem_bytes
    assert p["tiled"].family == TILES and p["tiled"].sweeps == VECTOR_SWEEPS
    assert p["tiled short"].family == TILES and p["tiled short"].group > 1
    assert p["tiled short"].sweeps == ELEMENT_SWEEPS
    assert p["tiled short, thread per row"].sweeps == PAIR_SWEEPS
    assert p["tiled short, thread per row, odd width"].sweeps == ELEMENT_SWEEPS
    for name in ("tiled short, thread per row", "tiled short, thread per row, odd width"):
        assert p[name].group == 1 and p[name].tile_rows > THREADS  # rows a thread
    assert PATHS["tiled short"][1] < 4 * per_vec <= PATHS["tiled"][1]
    assert p["registers"].family == ROWS and p["registers"].splits == 1
    assert p["row batches"].family == ROW_BATCHES
    assert p["one row"].family == ONE_ROW
    assert plan(16, 256000, elem_bytes).splits > 1  # split rows, in cases.SHAPES


def test_every_instance_is_reachable():
    """Every (family, compile-time choice, kind of load) the launch can pick is some plan's: the
    instances the build compiles are all in use."""
    seen = set()
    for (rows, cols), elem_bytes, stride, offset, ef in [
            (s, e, st, o, ef) for s in list(PATHS.values()) + [(4001, 2048), (4096, 32001), (53687, 2500), (20000, 80)]
            for e in (4, 2) for st in (None, "odd") for o in (0, e) for ef in (True, False)]:
        stride = cols + 1 if stride == "odd" else None
        p = plan(rows, cols, elem_bytes, ef, stride=stride, offset=offset)
        choice = {ROWS: p.lead_256 or not ef, TILES: p.sweeps, ROW_BATCHES: p.batch_rows, ONE_ROW: None}[p.family]
        seen.add((p.family, choice, ef if p.family != ONE_ROW else None))
    expected = ({(ROWS, lead, ef) for lead, ef in ((True, True), (True, False), (False, True))} |
                {(TILES, s, ef) for s in range(3) for ef in (True, False)} |
                {(ROW_BATCHES, b, ef) for b in (1, 2) for ef in (True, False)} |
                {(ONE_ROW, None, None)})
    assert seen == expected, expected ^ seen


def test_evict_first_loads_for_reads_of_a_few_l2_sizes_and_16_bit_row_batches():
    ef = policy._evict_first
    limit = policy._EVICT_FIRST_L2S * H100.l2_bytes
    for elem_bytes in (4, 2):
        assert ef(ROWS, 0, elem_bytes, H100) and ef(ROWS, limit, elem_bytes, H100)
        assert not ef(ROWS, limit + 1, elem_bytes, H100)
        assert not ef(TILES, limit + 1, elem_bytes, H100)
    assert ef(TILES, 65536 * 1000 * 2, 2, H100)                # 125 MiB of bf16 tiles
    assert ef(ROW_BATCHES, 32768 * 4096 * 2, 2, H100)          # 256 MiB of bf16 row batches
    assert not ef(ROWS, 5120 * 32000 * 2, 2, H100)             # 312 MiB
    assert not ef(ROW_BATCHES, 32768 * 4096 * 4, 4, H100)      # 512 MiB of fp32 row batches
    assert ef(ROW_BATCHES, 65536 * 8192 * 2, 2, H100)          # 1 GiB of 16-bit row batches


def test_fast_memory_is_bandwidth_per_sm():
    """Above 30 GB/s per SM: the H200 (36) and the B200 (54); not the H100 (25) nor the rest."""
    assert {name for name, g in GPU_PLANS.items() if policy._fast_memory(g)} == {"H200", "B200"}
    # two CTAs of row batches per SM keep two thirds of the bytes in flight: fast from 20 GB/s per SM
    sm75 = GPU_PLANS["H100"]._replace(cc=75, sms=100)
    assert policy._fast_memory(sm75._replace(bandwidth=2.1e12))
    assert not policy._fast_memory(sm75._replace(bandwidth=1.9e12))
    assert abs(GPU_PLANS["H100"].bandwidth - 3.35e12) < 0.01e12 and abs(GPU_PLANS["L40S"].bandwidth - 864e9) < 1e9


def test_fast_memory_takes_row_batches_up_to_a_few_l2_sizes(monkeypatch):
    limit = policy._FAST_MEMORY_L2S * GPUS["H200"]["l2_bytes"]
    for cols, elem_bytes in ((4096, 4), (4096, 2), (2048, 4), (8192, 2)):
        rows = limit // (cols * elem_bytes)
        p = plan_on(monkeypatch, "H200", rows, cols, elem_bytes)
        assert p.family == ROW_BATCHES and p.evict_first, (cols, elem_bytes)
        p = plan_on(monkeypatch, "H200", rows + 1, cols, elem_bytes)  # past it: rows in registers
        assert p.family == ROWS and p.evict_first == (elem_bytes == 2), (cols, elem_bytes)
        # The H100 takes both in row batches, and reads 16-bit rows evict-first at any size.
        p = plan_on(monkeypatch, "H100", rows + 1, cols, elem_bytes)
        assert p.family == ROW_BATCHES and p.evict_first
    p = plan_on(monkeypatch, "H200", 32768, 4096, 4)  # 512 MiB
    assert p.family == ROWS and not p.evict_first


def test_fast_memory_reads_evict_first_up_to_6_l2_sizes_but_fp32_rows_outside_tiles_up_to_3(monkeypatch):
    six, three = (n * GPUS["H200"]["l2_bytes"] for n in (policy._EVICT_FIRST_L2S, policy._FAST_MEMORY_L2S))
    for cols, elem_bytes, limit, tiles in [(32000, 2, six, False), (32000, 4, three, False),
                                           (4104, 4, three, False), (1000, 2, six, True), (1000, 4, six, True)]:
        rows = limit // (cols * elem_bytes)
        p = plan_on(monkeypatch, "H200", rows, cols, elem_bytes)
        assert p.evict_first and (p.family == TILES) == tiles, (cols, elem_bytes)
        assert not plan_on(monkeypatch, "H200", rows + 1, cols, elem_bytes).evict_first, (cols, elem_bytes)


def test_plan_on_reads_the_device(monkeypatch):
    p = plan_on(monkeypatch, "H100", 32768, 4096, 4)
    assert p == plan(32768, 4096, 4) and p.grid == 132 * CTAS_PER_SM
    calls = []
    monkeypatch.setattr(dispatch, "device_gpu", lambda i: calls.append(i) or H100)
    assert dispatch.plan_on(1, 100, 1000, 1000, 4, 0) == plan(100, 1000, 4) and calls == [1]


@pytest.mark.parametrize("rows, cols", [(1, 3), (5, 4096), (70000, 3), (70000, 4096), (5, 300000), (32768, 4096)])
def test_workspace_layouts_are_aligned(rows, cols):
    p = plan(rows, cols, 4, False)
    phase_bytes = 16 * (cols + 7)
    exact_off, weight_off, seg_off, phase_off, nbytes = params.workspace_layout(p.splits, rows, phase_bytes)
    # The counters first (16 bytes), then each exact sum's words, read 16 bytes at a time.
    assert exact_off == 16 and EXACT_WORDS % 2 == 0
    assert weight_off == exact_off + 8 * EXACT_WORDS and weight_off % 16 == 0
    assert seg_off >= weight_off + 8 * EXACT_WORDS and seg_off % 16 == 0
    assert phase_off == seg_off + (16 * rows * p.splits if p.splits > 1 else 0) and phase_off % 16 == 0
    assert nbytes == phase_off + phase_bytes


@pytest.mark.parametrize("elem_bytes", [4, 2])
def test_weight_phases_only_where_a_streamed_row_starts_off_the_weights_grid(elem_bytes):
    """weight_phase_bytes: the shifted copies of the class weights (streamed.cuh, row_weights), 16-byte
    vectors' worth of whole copies, one per element of a vector, where contiguous streamed rows do not
    all share the weights' 16-byte grid; nothing elsewhere."""
    per_vec = 16 // elem_bytes
    streamed = policy.plan_launch(8192, 50257, 50257, elem_bytes, H100, 0, weighted=True, smoothed=True)
    assert streamed.family == STREAMED
    phases = policy.weight_phase_bytes
    for cols in (1, 7, 50257, 4096):
        whole = -(-(cols + per_vec - 1) // per_vec) * per_vec  # a copy's elements: room for its shift
        assert phases(streamed, 3, cols, 4097, elem_bytes, 1, 0) == per_vec * whole * elem_bytes  # rows off the grid
        assert phases(streamed, 3, cols, 4096, elem_bytes, 1, 2 * elem_bytes) == 16 * whole  # the weights off theirs
    assert phases(streamed, 3, 50257, 4096, elem_bytes, 1, 0) == 0  # every row on the weights' grid
    assert phases(streamed, 1, 50257, 50257, elem_bytes, 1, 0) == 0  # one row, on it
    assert phases(streamed, 3, 50257, 50257, elem_bytes, 7, 0) == 0  # strided classes read one at a time
    assert phases(plan(8192, 50257, elem_bytes), 3, 50257, 50257, elem_bytes, 1, 4) == 0  # not streamed


def test_a_rounding_launch_takes_every_resident_cta_or_a_piece_a_thread():
    """round_grid: the float32 sums of linear's backward fill the GPU; a small one takes the CTAs that
    give each thread a piece of 8 elements, and an empty one a CTA."""
    assert policy.round_grid(128256 * 4096, H100) == policy._max_grid(policy.ROUND, H100) == 132 * CTAS_PER_SM
    assert policy.round_grid(8 * 256 * 5 + 1, H100) == 6 and policy.round_grid(0, H100) == 1
