"""The launch policy: for each problem the kernel family (plan_launch: _family), then the kind of load
(_evict_first), then that family's launch shape; and the gradient's, the fused family's, a split
vocabulary's and a float32 sum's rounding launches (gradient_plan, _fused_plan, split_grid,
round_grid). Pure functions of the problem's shape and of a Gpu's figures: no device is needed to
read or test them. The figures behind each rule are in docs/design, in the section the comment names."""
from typing import NamedTuple

from .constants import (BATCH, CTAS_PER_SM, CTAS_PER_SM_MORE_REGISTERS, ELEMENT_SWEEPS, FUSED, FUSED_CLUSTER_CTAS,
                        FUSED_VECS, GRADIENT, GRADIENT_VECS, MAX_SEG, ONE_ROW, ONE_ROW_THREADS, ONE_ROW_THREADS_SM75,
                        PAIR_SWEEPS, QUAD, QUAD_CLASSES, QUAD_STAGE_BYTES, ROW_BATCH_LOADS, ROUND, ROW_BATCHES, ROWS,
                        SCALE, SEG_SLAB, SHORT_TAIL, SPLIT_CTAS, SPLIT_MERGE, SPLIT_TERMS, STREAM_VECS, STREAMED,
                        THREADS, TILE_MIN_ROWS, TILE_TARGETS, TILES, VECTOR_SWEEPS)

# The host's alone:
_VECS_PER_THREAD = 16     # vectors a thread per row in registers: two batches ("Launch shape") ...
_MIN_SLOT_FILL = {BATCH: 0.8, _VECS_PER_THREAD: 0.7}  # ... half the group where a row fills less of them
_EVICT_FIRST_LEAD_MIN_GROUP = 64  # evict-first rows are counted from the 256-byte grid in groups this large
_CLAIM_BYTES = 16 << 10   # a CTA's round reads at least this much: chunks of one round ("Work balance")
_TILE_BYTES = THREADS * BATCH * 16  # a tile: one batch of every thread of a CTA
_EVICT_FIRST_L2S = 6      # logits of at most this many L2 sizes are read evict-first ("Loads")
_EVICT_FIRST_TILE_CTAS = 2        # CTAs per SM for evict-first tiles of rows of ...
_EVICT_FIRST_TILE_MIN_ROW = 512   # ... at least this many bytes ("Short rows")
_ROW_BATCH_VECS = THREADS * ROW_BATCH_LOADS  # the row-batch kernel's CTA batch, in 16-byte vectors ...
_ROW_BATCH_MIN_CHUNKS = 4         # ... taken where every CTA gets at least this many batches
_FAST_MEMORY_PER_SM = 30e9        # DRAM bytes/s per SM above which memory is fast, at 3 CTAs ("The H200") ...
_FAST_MEMORY_L2S = 3              # ... and row batches and fp32 evict-first rows stop at this many L2 sizes
_STREAM_BATCHES = 8       # the streamed family's batches of STREAM_VECS a lane per row, where rows are long enough

# Shared memory a CTA of each family holds, bytes: its largest array and at most 1 KB of small ones
# (test_cuda_source holds these to what ptxas reports); rows in registers count segments_total's slab.
# Both count the options build's own arrays (_OPTIONS_SHARED_BYTES: class weights; rows in registers,
# label smoothing's gaps too), which the default build lacks.
_OPTIONS_SHARED_BYTES = {ROWS: 12 * THREADS, TILES: _TILE_BYTES // TILE_MIN_ROWS}  # tiles: the class-weight table
_CTA_SHARED_BYTES = {
    ROWS: 16 * SHORT_TAIL * THREADS + 16 * SEG_SLAB + 4 * THREADS + _OPTIONS_SHARED_BYTES[ROWS] + 1024,
    TILES: _TILE_BYTES + 32 + 4 * THREADS * TILE_TARGETS + _OPTIONS_SHARED_BYTES[TILES] + 1024,
    ROW_BATCHES: 1024,
    ONE_ROW: 1024,
    STREAMED: 1024,
    GRADIENT: 1024,
    FUSED: 1024,
    SCALE: 1024,
    SPLIT_TERMS: 1024,
    SPLIT_MERGE: 1024,
    ROUND: 1024,
}


def _more_registers(cc):
    """Whether the code built for compute capability cc needs more than 85 registers a thread: sm_75's
    (it emulates what it lacks) and Blackwell's spilled there ("Every GPU")."""
    return cc < 80 or cc >= 100


def _ctas_per_sm(family, gpu, dynamic_shared=0):
    """CTAs of a family one SM holds at once: the launch bounds', or fewer where threads or shared
    memory run out (tiles: one on sm_75, two on sm_86, sm_89 and sm_120); dynamic_shared: what the
    launch adds (_quad_stage_bytes)."""
    bound = CTAS_PER_SM_MORE_REGISTERS if _more_registers(gpu.cc) else CTAS_PER_SM
    shared = _CTA_SHARED_BYTES[family] + dynamic_shared + gpu.smem_reserved
    return min(bound, gpu.threads_per_sm // THREADS, gpu.smem_per_sm // shared)


def _max_grid(family, gpu):
    """Every CTA of the family that fits on the GPU at once."""
    return gpu.sms * _ctas_per_sm(family, gpu)


def _fast_memory(gpu):
    """Whether memory outruns the row-batch kernel past a few L2 sizes of logits: that kernel keeps 16 KB
    per CTA in flight, at 3 CTAs per SM enough for the H100's 25 GB/s per SM, not for the H200's 36
    ("The H200"); the threshold scales with the CTAs an SM holds."""
    ctas = _ctas_per_sm(ROW_BATCHES, gpu)
    return gpu.bandwidth > _FAST_MEMORY_PER_SM * ctas / CTAS_PER_SM * gpu.sms


def _one_row_threads(gpu):
    return ONE_ROW_THREADS if gpu.cc >= 80 else ONE_ROW_THREADS_SM75


class Plan(NamedTuple):
    family: int          # ROWS, TILES, ROW_BATCHES, ONE_ROW, STREAMED, GRADIENT or FUSED
    evict_first: bool    # how the logits are loaded (_evict_first)
    grid: int            # CTAs
    group: int           # threads per item (a row, or a segment of one); the one-row kernel's CTA
    chunks: int          # the units of work the CTAs claim
    splits: int = 1      # rows in registers: segments per row
    seg_len: int = 0     # ... columns per segment, a multiple of the vector width
    rounds: int = 1      # ... items per group in a chunk
    lead_256: bool = False  # ... items counted from the 256-byte grid (_lead_256)
    tile_rows: int = 0   # tiles: rows per tile
    sweeps: int = 0      # ... how each row is reduced (_sweeps)
    batch_rows: int = 0  # row batches: rows per batch


def plan_launch(rows, cols, row_stride, elem_bytes, gpu, offset=0, weighted=False, smoothed=False, probs=False,
                class_stride=1, capped=False, fuse=False):
    """The launch plan for (rows, cols) logits of elem_bytes each, rows row_stride elements apart,
    the first one `offset` bytes past the 16-byte grid, on `gpu` (a Gpu); `weighted`: with class
    weights; `smoothed`: with label smoothing, which only tiles and whole rows in registers with
    evict-first loads compute ("Options"); `probs`: probability targets; class_stride: elements from
    a class to the next (above 1 for inputs (N, C, d1, ..., dk), whose rows are sample positions);
    `capped`: soft-capped logits. Those, and weights with label smoothing, take the streamed family
    ("Streamed rows"). `fuse`: the logits alone require grad; the fused family takes contiguous rows
    of class indices on the 16-byte grid that fit its registers (_fused_plan)."""
    if fuse and not probs and class_stride == 1 and (row_stride == cols or rows == 1) and not offset:
        fused = _fused_plan(rows, cols, elem_bytes, gpu, capped)
        if fused:
            return fused
    if probs or class_stride > 1 or (weighted and smoothed) or capped:
        return _streamed_shape(rows, cols, elem_bytes, gpu, class_stride, offset, probs)
    family = _family(rows, cols, row_stride, elem_bytes, gpu, offset, weighted, smoothed)
    evict_first = _evict_first(family, rows * cols * elem_bytes, elem_bytes, gpu) or (smoothed and family == ROWS)
    return _shape(family, rows, cols, row_stride, elem_bytes, gpu, offset, evict_first, smoothed)


def _family(rows, cols, row_stride, elem_bytes, gpu, offset, weighted=False, smoothed=False):
    """The kernel family: the first of these that takes the problem.

    one row      a lone row of up to 128 KB (sm_75: 64)                       "One row"
    row batches  1 or 2 rows fill the row-batch kernel's CTA batch (_batch_rows), "Rows that fill a CTA batch"
                 without class weights (each chunk's merge would wait for them) "Options"
    tiles        rows of at most an eighth of a tile, close together (_tile_fit); "Short rows"
                 with class weights, rows whose weights fit the tiles' table     "Options"
    rows         the rest, in registers, split into segments where too few     "Long rows"
    With label smoothing only tiles, else rows in registers, whole            "Options"
    """
    tiles = _tile_fit(rows, cols, row_stride, elem_bytes) and (
        not weighted or cols * elem_bytes <= _OPTIONS_SHARED_BYTES[TILES])  # overlapping rows may be longer
    if smoothed:
        return TILES if tiles else ROWS
    if rows == 1 and cols // (16 // elem_bytes) <= _one_row_threads(gpu) * BATCH:
        return ONE_ROW
    if not weighted and _batch_rows(rows, cols, row_stride, elem_bytes, gpu, offset):
        return ROW_BATCHES
    return TILES if tiles else ROWS


def _shape(family, rows, cols, row_stride, elem_bytes, gpu, offset, evict_first, smoothed=False):
    """The family's launch shape, for the kind of load chosen (_evict_first)."""
    if family == ONE_ROW:
        # One CTA of as many threads as hold a batch of the row each.
        threads = max(32, _pow2_at_least(-(-(cols // (16 // elem_bytes)) // BATCH)))
        return Plan(ONE_ROW, evict_first, grid=1, group=threads, chunks=1)
    if family == ROW_BATCHES:
        batch_rows = _batch_rows(rows, cols, row_stride, elem_bytes, gpu, offset)
        return Plan(ROW_BATCHES, evict_first, max(1, _max_grid(ROW_BATCHES, gpu)), THREADS, -(-rows // batch_rows),
                     batch_rows=batch_rows)
    if family == TILES:
        return _tile_shape(rows, cols, row_stride, elem_bytes, gpu, offset, evict_first)
    return _row_shape(rows, cols, elem_bytes, gpu, evict_first, smoothed)


def _streamed_shape(rows, cols, elem_bytes, gpu, class_stride, offset, probs):
    """The streamed family. Strided classes: a thread per position, or per QUAD of them where their
    logits share a load (class indices, the class stride and the first logit on the grid of QUAD
    elements), in `group`. Contiguous: lanes few enough that each takes _STREAM_BATCHES batches of
    a row (each row's merge and the wait for its last batch amortized), at most a CTA. A chunk is a
    CTA's rows; every CTA that fits, or as many as there are chunks."""
    staged = 0  # quads' dynamic shared memory
    if class_stride > 1:
        group = QUAD if not probs and class_stride % QUAD == 0 and offset % (QUAD * elem_bytes) == 0 else 1
        chunk_rows = THREADS * group
        staged = _quad_stage_bytes(elem_bytes) if group == QUAD else 0
    else:
        batches = STREAM_VECS * _STREAM_BATCHES
        group = min(THREADS, _pow2_at_least(max(1, -(-(cols // (16 // elem_bytes)) // batches))))
        chunk_rows = THREADS // group
    chunks = -(-rows // chunk_rows)
    return Plan(STREAMED, False, max(1, min(gpu.sms * _ctas_per_sm(STREAMED, gpu, staged), chunks)), group, chunks)


def weight_phase_bytes(plan, rows, cols, row_stride, elem_bytes, class_stride, grid_gap):
    """The workspace bytes of the class weights' shifted copies (streamed.cuh, row_weights) for a
    streamed launch whose contiguous rows read class weights a vector at a time (the caller's test:
    label smoothing or probability targets), where some row starts off the weights' 16-byte grid;
    else 0. grid_gap: the logits' address minus the weights', mod 16. A copy per element of a vector,
    each of whole vectors with room for its shift ("Streamed rows")."""
    if plan.family != STREAMED or class_stride != 1:
        return 0
    if grid_gap == 0 and (rows == 1 or row_stride * elem_bytes % 16 == 0):
        return 0
    per_vec = 16 // elem_bytes
    return 16 * (-(-(cols + per_vec - 1) // per_vec) * per_vec)


def _quad_stage_bytes(elem_bytes):
    """The shared memory a CTA of quads stages its classes in, as the kernels' launch gives it
    (kQuadStages stages of kQuadClasses classes of every thread's quad), or 0 where one stage
    would hold no more than registers do and quads load directly (float32)."""
    stage = QUAD_CLASSES * THREADS * QUAD * elem_bytes
    stages = QUAD_STAGE_BYTES // stage
    return stages * stage if stages > 1 else 0


def gradient_plan(rows, cols, elem_bytes, gpu, class_stride):
    """The gradient's launch ("The gradient"): contiguous classes take `group` lanes a row, a power
    of two that gives each lane at most GRADIENT_VECS vectors of it, and at most a warp's (the
    probabilities' sum shuffles within one); strided classes a thread a position. Every CTA that
    fits, or as many as the rows need."""
    group = 1 if class_stride > 1 else min(32, _pow2_at_least(-(-cols // (16 // elem_bytes * GRADIENT_VECS))))
    grid = max(1, min(_max_grid(GRADIENT, gpu), -(-rows // (THREADS // group))))
    return Plan(GRADIENT, False, grid, group, chunks=0)


def split_grid(rows):
    """A split vocabulary's row launches (families/split.cuh): a thread a row, at most SPLIT_CTAS CTAs,
    and one where there is no row (the merge's last CTA stores the loss). The same on every GPU: the
    merge's sums follow the grid, and every rank must get the same bits."""
    return max(1, min(SPLIT_CTAS, -(-rows // THREADS)))


def round_grid(elements, gpu):
    """A float32 sum's rounding launch (families/scale.cuh): every CTA that fits, or as many as give
    each thread a piece of 8 elements (a 16-bit format's vector, two of float32's)."""
    return max(1, min(_max_grid(ROUND, gpu), -(-elements // (8 * THREADS))))


def _fused_plan(rows, cols, elem_bytes, gpu, capped=False):
    """The fused family's launch ("The gradient"), or None where a row does not fit registers:
    `group` lanes a row, the fewest that hold its vectors at FUSED_VECS each (half as many on sm_75,
    as its kernel takes them), and at least a lane for each element off the vectors (fewer than two
    vectors' worth): several rows a warp where they are short ("The gradient"); a chunk is a CTA's
    rows; every CTA that fits, or as many as there are chunks. From sm_90 on, a row of more than a CTA's lanes takes the same lanes of each
    CTA of a cluster (FUSED_CLUSTER_CTAS at most), and a chunk is a row; not where the logits are
    `capped` (the kernel's soft-capped instance has no cluster form). A cluster's CTAs hold a share of a
    row in shared memory too, which may leave an SM fewer of them."""
    per_lane = FUSED_VECS // 2 if gpu.cc < 80 else FUSED_VECS
    group = max(2 * (16 // elem_bytes), _pow2_at_least(-(-cols // (16 // elem_bytes * per_lane))))
    ctas = max(1, group // THREADS)
    if ctas > (1 if gpu.cc < 90 or capped else FUSED_CLUSTER_CTAS if gpu.cc == 90 else 8):
        return None
    chunks = -(-rows // max(1, THREADS // group))
    share_bytes = 16 * THREADS * per_lane if ctas > 1 else 0  # a cluster's CTA copies its share ahead
    clusters = gpu.sms * _ctas_per_sm(FUSED, gpu, share_bytes) // ctas
    return Plan(FUSED, False, max(1, min(clusters, chunks)) * ctas, group, chunks)


def _pow2_at_least(x):
    return 1 << max(0, (int(x) - 1).bit_length())


# ---------------------------------------------------------------------------------- row batches
def _batch_rows(rows, cols, row_stride, elem_bytes, gpu, offset):
    """Rows per chunk for the row-batch kernel: 1 or 2 where that many rows of whole 16-byte
    vectors, each starting on the 16-byte grid, fill its CTA batch exactly, every CTA gets several
    batches, and (where memory is fast) the logits are at most a few L2 sizes; else 0."""
    per_vec = 16 // elem_bytes
    if offset or cols % per_vec or row_stride % per_vec:
        return 0
    batch_rows = _ROW_BATCH_VECS // (cols // per_vec)
    if batch_rows not in (1, 2) or batch_rows * (cols // per_vec) != _ROW_BATCH_VECS:
        return 0
    if rows < batch_rows * _ROW_BATCH_MIN_CHUNKS * _max_grid(ROW_BATCHES, gpu):
        return 0
    if _fast_memory(gpu) and rows * cols * elem_bytes > _FAST_MEMORY_L2S * gpu.l2_bytes:
        return 0  # its 48 KB per SM in flight cannot keep up there ("The H200")
    return batch_rows


# ---------------------------------------------------------------------------------- tiles
def _tile_fit(rows, cols, row_stride, elem_bytes):
    """The most rows a shared-memory tile holds, or 0 where rows are too long to stage. A tile is
    the stretch from its first row's first element to its last row's last, gaps included, so rows
    further apart than a little over their length are not staged: the gaps would be read too."""
    span = _TILE_BYTES // elem_bytes
    stride = row_stride if rows > 1 else cols
    if cols > span or stride > cols + max(cols // 8, 32 // elem_bytes):
        return 0
    fit = min(THREADS * TILE_TARGETS, 1 + (span - cols) // stride if stride else span)
    return fit if fit >= TILE_MIN_ROWS else 0


def _tile_rows(rows, fit, max_grid):
    """Rows per tile, at most `fit` (_tile_fit, nonzero), for a grid of max_grid CTAs."""
    per_cta = -(-rows // max_grid)
    if per_cta <= THREADS or fit < THREADS:
        # Smaller tiles where the rows would not fill every CTA with one tile each.
        return max(1, min(fit, per_cta))
    # Tiles of more rows than threads: a thread per row, a row per sweep. A tile of whole sweeps, as
    # many as leave the busiest CTA fewest sweeps in all (its tiles times their sweeps), the larger
    # tile on a tie: a partial last sweep, or a last round of tiles that few CTAs take, costs the
    # time of a whole one ("Short rows").
    def busiest(sweeps):
        tiles = -(-rows // (sweeps * THREADS))
        return -(-tiles // max_grid) * sweeps
    return THREADS * min(range(fit // THREADS, 0, -1), key=busiest)


def _tile_shape(rows, cols, row_stride, elem_bytes, gpu, offset, evict_first):
    max_grid = _max_grid(TILES, gpu)
    fit = _tile_fit(rows, cols, row_stride, elem_bytes)
    tile_rows = _tile_rows(rows, fit, max_grid)
    if evict_first and not _fast_memory(gpu) and cols * elem_bytes >= _EVICT_FIRST_TILE_MIN_ROW:
        # Evict-first tiles of rows this long stream faster with fewer CTAs per SM, unless that
        # turns one wave of tiles into a wave and a bit ("Short rows").
        fewer = gpu.sms * min(_EVICT_FIRST_TILE_CTAS, _ctas_per_sm(TILES, gpu))
        fewer_rows = _tile_rows(rows, fit, fewer)
        if -(-rows // fewer_rows) <= fewer or -(-rows // tile_rows) > max_grid:
            max_grid, tile_rows = fewer, fewer_rows
    # A group of a power of two threads (at most a warp) per row, so that the CTA's groups cover
    # the tile's rows about once over; a thread per row where a tile has more rows than the CTA
    # has threads (whole sweeps of them: _tile_rows).
    group = 1 << min(5, max(0, (THREADS // tile_rows).bit_length() - 1))
    chunks = -(-rows // tile_rows)
    return Plan(TILES, evict_first, max(1, min(max_grid, chunks)), group, chunks, tile_rows=tile_rows,
                 sweeps=_sweeps(cols, row_stride, elem_bytes, group, offset))


def _sweeps(cols, row_stride, elem_bytes, group, offset):
    """How the tiles' kernel reduces a row: cut at 16-byte boundaries where it has 4 vectors or
    more; else two elements a load where rows a thread each (group 1) have an even length and
    stride and start on a pair's boundary (2 elements), in shared memory too; else element by
    element. Each a kernel of its own ("Short rows")."""
    if cols >= 4 * (16 // elem_bytes):
        return VECTOR_SWEEPS
    if group == 1 and (cols | row_stride) % 2 == 0 and offset % (2 * elem_bytes) == 0:
        return PAIR_SWEEPS
    return ELEMENT_SWEEPS


# ---------------------------------------------------------------------------------- rows in registers
def _row_shape(rows, cols, elem_bytes, gpu, evict_first, smoothed=False):
    per_vec = 16 // elem_bytes
    max_grid = _max_grid(ROWS, gpu)
    splits, seg_len = _segments(rows, cols, per_vec, max_grid, smoothed)
    group = THREADS if splits > 1 else _row_group(rows, seg_len, per_vec, gpu, evict_first)
    # Chunks of one round each, claimed as CTAs finish them, balance the end of the stream. Where
    # a round is only a few KB (very short rows) the claim's barrier costs more than it balances:
    # then each CTA gets one chunk of as many rounds as its share needs ("Work balance").
    items, groups = rows * splits, THREADS // group
    rounds = 1 if groups * min(seg_len, cols) * elem_bytes >= _CLAIM_BYTES else max(1, -(-items // (groups * max_grid)))
    chunks = -(-items // (groups * rounds))
    lengths = [cols] if splits == 1 else [seg_len, cols - (splits - 1) * seg_len]
    return Plan(ROWS, evict_first, max(1, min(max_grid, chunks)), group, chunks, splits, seg_len, rounds,
                 _lead_256(group, lengths, per_vec, evict_first))


def _segments(rows, cols, per_vec, max_grid, whole=False):
    """Segments per row and their length. Fewer rows than CTAs: each row is cut so that every SM
    streams, as long as a segment still gives every thread of its CTA a full batch (shorter rows
    are cheaper whole; "Long rows"). `whole`: never cut (label smoothing, up to MAX_SEG columns)."""
    splits = -(-cols // MAX_SEG)
    if 0 < rows < max_grid and not whole:
        splits = max(splits, min(max_grid // rows, -(-cols // per_vec) // (BATCH * THREADS), SEG_SLAB))
    seg_len = -(-cols // splits)
    seg_len = -(-seg_len // per_vec) * per_vec  # whole vectors
    return max(1, -(-cols // seg_len)), seg_len


def _row_group(rows, cols, per_vec, gpu, evict_first):
    """Threads per row: as many as give each _VECS_PER_THREAD of its vectors (two batches), or one
    batch with evict-first loads on the H100, where each CTA batch covering whole rows streams
    faster ("Launch shape")."""
    vecs = -(-cols // per_vec)
    per_thread = BATCH if evict_first and not _fast_memory(gpu) else _VECS_PER_THREAD
    group = min(THREADS, _pow2_at_least(-(-vecs // per_thread)))
    # A row just over a power of two of vectors leaves up to half of each thread's slots empty;
    # where it fills less than _MIN_SLOT_FILL of them, half the group streams faster: each thread's
    # first batch is full and a CTA has twice the groups. Not on rows longer than a round of the
    # largest group ("Launch shape").
    if group >= 32 and vecs <= per_thread * THREADS and vecs < _MIN_SLOT_FILL[per_thread] * per_thread * group:
        group //= 2
    # Few rows leave SMs idle: more threads per row while the CTAs still get an SM each.
    while group < THREADS and -(-rows // (THREADS // (2 * group))) <= gpu.sms:
        group *= 2
    return group


def _lead_256(group, lengths, per_vec, evict_first):
    """Whether the kernel counts the vectors of each item (a row, or a segment of `lengths[k]`
    columns) from the 256-byte boundary at or below its body, so that each warp's load covers whole
    256-byte blocks ("Loads"). Plain loads: in every group of two threads or more (the kernel keeps
    a lone thread on the 16-byte grid either way). Evict-first loads: only in groups of
    _EVICT_FIRST_LEAD_MIN_GROUP or more, and only where the lead changes none of an item's batches,
    wherever it starts: as many, the last riding along (SHORT_TAIL) or not alike."""
    if group == 1:
        return False
    if not evict_first:
        return True
    if group < _EVICT_FIRST_LEAD_MIN_GROUP:
        return False
    batch = BATCH * group

    def last_batch(end):  # its first vector
        return (end - 1) // batch * batch

    def rides(end):
        return last_batch(end) > 0 and end - last_batch(end) <= SHORT_TAIL * group

    for length in lengths:
        # The body's end in vectors, lead included: fewest where the item starts one element past the
        # 16-byte grid and takes no lead, most where it starts on that grid 15 vectors past the 256-byte
        # one. Both in the same last batch, after a first one, and riding alike.
        fewest, most = (length - per_vec + 1) // per_vec, length // per_vec + 15
        if last_batch(fewest) < batch or last_batch(most) != last_batch(fewest) or rides(most) != rides(fewest):
            return False
    return True


# ---------------------------------------------------------------------------------- loads
def _evict_first(family, logit_bytes, elem_bytes, gpu):
    """Whether the logits are read with evict-first loads, which leave the rest of L2 in place.
    Where L2 holds dirty lines (KernelBench's flush; in training, another kernel's output) that
    saves their write-back, but the read streams a few % slower while they stay: it wins up to
    about 6 L2 sizes of logits, and 16-bit rows in row batches win at any size. Where memory is
    fast (the H200), fp32 rows outside tiles win only up to 3 L2 sizes ("Loads", "The H200")."""
    if _fast_memory(gpu) and elem_bytes == 4 and family != TILES:
        return logit_bytes <= _FAST_MEMORY_L2S * gpu.l2_bytes
    return logit_bytes <= _EVICT_FIRST_L2S * gpu.l2_bytes or (family == ROW_BATCHES and elem_bytes == 2)

