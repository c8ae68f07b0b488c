"""Rows in registers (cross_entropy_rows_kernel): the family's launch shape on the CPU, its cases
on the GPU: the target logit from every lane, vector, element and warp of a group, scalar edges,
the 256-byte lead, the short last batch, and rows split into segments."""
import pytest
import torch

from crossent import build, constants
from crossent import policy as launch_policy

from cases import DTYPES, logits, targets, views
from gpu_checks import assert_matches, launched_kernel, plan_for, spiked, spread_columns
from plans import H100, H200, SHAPES, gpu, plan


# ------------------------------------------------------------------ the shape (CPU)
@pytest.mark.parametrize("elem_bytes", [4, 2])
@pytest.mark.parametrize("sms", [132, 108, 1, 1000])
@pytest.mark.parametrize("evict_first", [True, False], ids=["evict-first", "plain"])
def test_segments_tile_each_row(elem_bytes, sms, evict_first):
    per_vec = 16 // elem_bytes
    plans = [(rows, cols, plan(rows, cols, elem_bytes, evict_first, on=gpu(sms))) for rows, cols in SHAPES]
    plans = [(rows, cols, p) for rows, cols, p in plans if p.family == constants.ROWS]
    assert any(p.splits > 1 for *_, p in plans) and any(p.splits == 1 for *_, p in plans)
    for rows, cols, p in plans:
        assert p.seg_len % per_vec == 0 and p.seg_len <= constants.MAX_SEG
        # none empty, none missing; the last CTA can stage a row's partials at once
        assert (p.splits - 1) * p.seg_len < cols <= p.splits * p.seg_len, (rows, cols, p)
        assert p.splits <= constants.SEG_SLAB
        assert p.splits == 1 or p.group == constants.THREADS  # segments are long: a CTA each
        assert rows * p.splits // p.grid < 2**31  # items per CTA fit a 32-bit count


@pytest.mark.parametrize("cols, elem_bytes", [(4096, 2), (4096, 4), (2048, 4), (8192, 2), (1800, 4)])
def test_evict_first_rows_take_one_batch_per_thread(cols, elem_bytes):
    # Off the 16-byte grid, so that rows that fill a batch exactly stream through registers too.
    plain, evict_first = (plan(32768, cols, elem_bytes, ef, offset=elem_bytes) for ef in (False, True))
    vecs = -(-cols * elem_bytes // 16)
    assert plain.group * launch_policy._VECS_PER_THREAD >= vecs > plain.group * launch_policy._VECS_PER_THREAD // 2
    assert evict_first.group == 2 * plain.group  # each thread one batch of the row
    assert evict_first.group * constants.BATCH >= vecs > evict_first.group * constants.BATCH // 2
    # rows longer than a CTA's batch: a whole CTA per row either way
    assert plan(4096, 32000, 2, True).group == plan(4096, 32000, 2, False).group == 256


@pytest.mark.parametrize("cols, elem_bytes, evict_first, group", [
    (4100, 4, True, 128), (4100, 4, False, 64),  # 1025 vectors: 4 or 5 a thread of 8 at 256 threads
    (2052, 4, True, 64), (4104, 2, True, 64), (1100, 4, True, 32), (2200, 2, False, 16),
    (5600, 4, True, 128),                        # 1400 vectors: 68% of 256 threads' slots
    (7000, 4, True, 256), (6560, 4, True, 256),  # one batch fills 85% and 80%: 80% is enough
    (12000, 4, False, 256),                      # two batches fill 73%: 70% is enough
    (10000, 4, True, 256), (16400, 4, True, 256),  # longer than a round of 256 threads: left whole
])
def test_rows_that_leave_slots_empty_get_half_the_group(cols, elem_bytes, evict_first, group):
    p = plan(32768, cols, elem_bytes, evict_first)
    assert p.family == constants.ROWS and p.splits == 1 and p.group == group, p
    vecs = -(-cols * elem_bytes // 16)
    per_thread = constants.BATCH if evict_first else launch_policy._VECS_PER_THREAD
    whole = min(constants.THREADS, launch_policy._pow2_at_least(-(-vecs // per_thread)))
    assert p.group in (whole, whole // 2)
    if p.group < whole:  # halved: every thread's first batch is full
        fill = launch_policy._MIN_SLOT_FILL[per_thread]
        assert vecs >= p.group * constants.BATCH and vecs < fill * per_thread * whole


def test_fast_memory_keeps_two_batches_per_item_with_evict_first_loads():
    h100, h200 = plan(32768, 4104, 2, True, on=H100), plan(32768, 4104, 2, True, on=H200)
    assert h200.group == h100.group // 2 == plan(32768, 4104, 2, False).group


def test_few_rows_get_more_threads_while_each_cta_has_an_sm():
    p = plan(64, 5000, 4, False)
    assert p.group == 256 and p.grid == 64
    for rows in (300, 1000, 2000, 32768):  # bigger groups would put more CTAs than SMs
        p = plan(rows, 4096, 2, False, offset=2)  # off the 16-byte grid: rows in registers
        assert p.group == 256 or -(-rows // (constants.THREADS // (2 * p.group))) > 132
        assert p.group == plan(32768, 4096, 2, False, offset=2).group or p.grid <= 132


def test_few_long_rows_are_split_across_ctas():
    p = plan(16, 256000, 4, False)
    assert p.splits >= 8 and p.grid >= 128
    assert plan(1, 32772, 4, False).splits > 1  # a lone row past the one-row kernel's 128 KB


def test_long_rows_are_claimed_a_round_at_a_time_and_short_rows_are_shared_out():
    long_rows = plan(32768, 4096, 4, False, offset=4)  # 64 KB a round: claims balance the end
    assert long_rows.rounds == 1 and long_rows.chunks > 8 * long_rows.grid
    short = plan(1000000, 10, 4, False, stride=4096)  # short rows far apart: 10 KB a round, one chunk per CTA
    assert short.family == constants.ROWS and short.rounds > 1 and short.chunks == short.grid


def kernel_batches(end, group):
    """item_lse's batches for a body ending at vector `end` (lead included): the last batch's first
    vector, and whether that batch rides along with the one before it (ShortTail)."""
    batch = constants.BATCH * group
    tail_batch = (end - 1) & -batch
    return tail_batch, tail_batch > 0 and end - tail_batch <= constants.SHORT_TAIL * group


@pytest.mark.parametrize("per_vec", [4, 8])
@pytest.mark.parametrize("group", [1, 2, 32, 64, 128, 256])
def test_lead_256_only_where_no_item_changes_its_batches(per_vec, group):
    """_lead_256 against every start an item can have: each element offset from the 16-byte grid (its
    head) and each lead of 0 to 15 vectors. Evict-first loads take the lead in groups of 64 or more
    only where every item has two batches or more and keeps them, as many and riding alike, whatever
    its start; plain loads in every group but a lone thread."""
    batch = constants.BATCH * group
    # lengths around each batch's end and around where a last batch stops riding (half a batch in)
    lengths = sorted({n for k in range(1, 6) for half in (0, batch // 2) for d in range(-130, 131, 3)
                      if (n := (k * batch + half) * per_vec + d) > 0} | set(range(1, 3 * per_vec * 16 + 1, 7)))
    for length in lengths:
        starts = [(length - head) // per_vec for head in range(per_vec)]  # whole vectors in the body
        keeps = all(kernel_batches(nvec + lead, group) == kernel_batches(nvec, group) and kernel_batches(nvec, group)[0] > 0
                    for nvec in starts for lead in range(16))
        assert launch_policy._lead_256(group, [length], per_vec, True) == (group >= 64 and keeps), length
        assert launch_policy._lead_256(group, [length], per_vec, False) == (group > 1), length
    # segments: every length must keep its batches
    keep, change = (batch + 3 * batch // 4) * per_vec, batch * per_vec  # 1.75 batches; one exactly
    if group >= 64:
        assert launch_policy._lead_256(group, [keep, keep], per_vec, True)
        assert not launch_policy._lead_256(group, [keep, change], per_vec, True)


@pytest.mark.parametrize("rows, cols, elem_bytes, lead", [
    (4096, 32001, 2, True), (3000, 40001, 2, True), (20000, 6001, 2, True), (13421, 5001, 4, True),
    (8192, 16385, 2, False),  # 2047 or 2048 vectors: the lead would add a second batch
    (16000, 7001, 2, False),  # one batch
    (53687, 2500, 2, False),  # groups of 32
    (4096, 32000, 2, True),   # on the 256-byte grid: a lead of 0, which the kernel works out per row
])
def test_evict_first_rows_counted_from_the_256_byte_grid(rows, cols, elem_bytes, lead):
    p = plan(rows, cols, elem_bytes, True)
    assert p.family == constants.ROWS and p.splits == 1 and p.lead_256 == lead, p
    assert plan(rows, cols, elem_bytes, False).lead_256  # plain loads: always


# ------------------------------------------------------------------ the cases (GPU)
@pytest.mark.gpu
@pytest.mark.parametrize("evict_first", [True, False], ids=["evict-first", "plain"])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("rows, cols", [(2000, 2000), (3000, 3000), (4099, 4099), (2000, 20000), (1000, 7600),
                                        (1500, 1100), (1000, 5000)])
def test_target_logit_taken_from_every_position(model, policy, rows, cols, dtype, evict_first):
    """Rows in registers take the target logit out of the stream, in the lane that reads it. Targets
    at every column (or both ends and a spread) put it in every lane, vector, element and warp of a
    group (32 to 256 threads per row), and in the scalar edges of rows off the 16-byte grid. The
    load kind picks the group size, so both run. 3000 (evict-first) and 4099 columns take half
    groups; 7600 columns (evict-first) a batch full in some lanes of the group only; 1100, 5000 and
    20000 columns a short last batch, which rides along with the one before it through shared
    memory, its targets included."""
    policy("_evict_first", lambda *_: evict_first)
    t = spread_columns(rows, cols)
    for name, x in [("aligned", logits(rows, cols, dtype))] + views(rows, cols, dtype)[:2]:
        x = spiked(x, t)
        assert_matches(model(x, t), x, t)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_lone_thread_rows_off_the_256_byte_grid(model, policy, dtype):
    """Short rows far apart (a strided view, too sparse to stage in tiles), many of them, read with
    plain loads: a thread each. Rows 16400 bytes apart start at every 16-byte step of the 256-byte
    grid; a lone thread keeps the 16-byte grid, since its first batch could not cover a lead of 9 to
    15 vectors."""
    policy("_evict_first", lambda *_: False)
    per_vec = 16 // dtype.itemsize
    rows, cols = 20000, 10 * per_vec
    x = logits(rows, 1025 * per_vec, dtype)[:, :cols]
    t = targets(rows, cols)
    p = plan_for(x)
    assert p.family == constants.ROWS and p.group == 1 and not p.evict_first, p
    assert_matches(model(x, t), x, t)


@pytest.mark.gpu
@pytest.mark.parametrize("evict_first", [True, False], ids=["evict-first", "plain"])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_edges_of_short_rows_beyond_one_a_lane(model, policy, dtype, evict_first):
    """Short rows far apart and off the 16-byte grid, in registers with groups of 1 or 2 lanes: up to
    2 * (kPerVec - 1) scalar edges a row, more than the group has lanes. A lane's first edge is
    folded after the first batch's loads, the rest at once; a target in every column of the row
    puts it in each of them."""
    policy("_evict_first", lambda *_: evict_first)
    per_vec = 16 // dtype.itemsize
    rows, cols = 20000, 10 * per_vec + per_vec - 1
    x = logits(rows, 1025 * per_vec + 1, dtype)[:, 1:cols + 1]  # an odd stride: every offset from the grid
    t = spread_columns(rows, cols)
    p = plan_for(x)
    assert p.family == constants.ROWS and p.group <= 2, p
    x = spiked(x, t)
    assert_matches(model(x, t), x, t)


@pytest.mark.gpu
@pytest.mark.parametrize("evict_first", [True, False], ids=["evict-first", "plain"])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_special_values_in_the_edges_of_rows_off_the_grid(model, policy, dtype, evict_first):
    """-inf, +inf and NaN in the scalar edges of a row in registers, folded after the first batch's
    loads, give what PyTorch gives, beside an ordinary row. The row starts one element past the
    16-byte grid and is 5001 columns wide: its first 3 (float32) or 7 (16-bit) columns and its
    last 2 are edges."""
    policy("_evict_first", lambda *_: evict_first)
    cols = 5001
    cases = {  # name: (columns of row 0, value, row 0's target)
        "all -inf: NaN": (slice(None), float("-inf"), 1),
        "-inf at the target, in the head: +inf": ([2], float("-inf"), 2),
        "-inf in both edges, not at the target: finite": ([0, cols - 1], float("-inf"), 3),
        "+inf in the head: NaN": ([0], float("inf"), 4),
        "NaN in the tail: NaN": ([cols - 1], float("nan"), 5),
    }
    for name, (where, value, target) in cases.items():
        x = torch.randn(2, cols + 1, device="cuda", dtype=dtype)[:, 1:]
        x[0, where] = value
        t = torch.tensor([target, 5], device="cuda")
        p = plan_for(x)
        assert x.data_ptr() % 16 and p.family == constants.ROWS and p.splits == 1, p
        expected = torch.nn.functional.cross_entropy(x.float(), t)
        rtol = 1e-5 if dtype == torch.float32 else 1e-2  # a 16-bit result
        torch.testing.assert_close(model(x, t).float(), expected, equal_nan=True, rtol=rtol, atol=0, msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_evict_first_rows_off_the_256_byte_grid_take_the_lead(model, policy, dtype):
    """Evict-first rows in registers counted from the 256-byte grid (_lead_256), in their own
    instance: 2500 or 2501 vectors a row, two batches of a group of 256 threads (three of 128 where
    memory is fast), the last riding along. Rows an odd number of elements apart start at every
    element offset of the 256-byte grid, so every lead from 0 to 15 occurs, beside every head and
    tail of scalar edges; the targets sit in the first and last 32 columns and spread between them,
    so in lanes before and after the lead's end."""
    policy("_evict_first", lambda *_: True)
    cols = 40004 // dtype.itemsize | 1  # 10001 float32 or 20003 16-bit columns: odd, and so is the stride
    for name, x in [("odd stride", logits(1000, cols + 2, dtype)[:, :cols]),
                    ("odd stride, unaligned start", logits(1000, cols + 2, dtype)[:, 1:cols + 1])]:
        t = spread_columns(1000, cols)
        p = plan_for(x)
        assert p.evict_first and p.lead_256 and p.group >= 128 and p.splits == 1, (name, p)
        x = spiked(x, t)
        out = []
        family, args = launched_kernel(lambda: out.append(model(x, t)))
        assert family == "rows" and args["evict_first"] == args["lead_256"] == "true", args
        assert_matches(out[0], x, t)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_target_logit_at_segment_boundaries(model, dtype):
    """Rows split across CTAs: a target on either side of every segment boundary, and at both ends."""
    rows, cols = 4, 300001
    for name, x in [("aligned", logits(rows, cols, dtype))] + views(rows, cols, dtype)[:2]:
        p = plan_for(x)
        assert p.splits > 1
        cuts = [k * p.seg_len + d for k in range(1, p.splits) for d in (-1, 0)] + [0, cols - 1]
        for i in range(0, len(cuts), rows):
            t = torch.tensor((cuts[i:i + rows] * rows)[:rows], device="cuda")
            x = spiked(x, t)
            assert_matches(model(x, t), x, t)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, cols", [(100, 400000), (1, 2**22)])
def test_segments_merged_a_slab_at_a_time(model, policy, rows, cols):
    """On a GPU of many SMs rows split further than on this one: more segment partials than the last
    CTA stages at once (100 rows in 30 segments each, 6 slabs), or a row in the most segments (512,
    16 per lane). Planned here for 1000 SMs and launched on this GPU, whose CTAs claim the chunks."""
    many = build.device_gpu(torch.cuda.current_device())._replace(sms=1000)
    policy("device_gpu", lambda _: many)
    x, t = logits(rows, cols, torch.float32), targets(rows, cols)
    if rows > 1:
        t[rows // 3] = -100
    p = plan_for(x)
    assert rows * p.splits > constants.SEG_SLAB or p.splits == constants.SEG_SLAB
    assert_matches(model(x, t), x, t)


@pytest.mark.gpu
def test_ignore_index_in_split_rows(model):
    x, t = logits(16, 256000, torch.float32), targets(16, 256000)
    t[3] = -100
    assert_matches(model(x, t), x, t)
