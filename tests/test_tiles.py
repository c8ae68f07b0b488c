"""Tiles of short rows (cross_entropy_tiles_kernel): the family's launch shape on the CPU, its cases
on the GPU: each way of reducing a row from shared memory (vectors, elements, pairs)."""
import pytest
import torch

from crossent import constants
from crossent import policy as launch_policy

from cases import DTYPES, PATHS, logits, targets
from gpu_checks import assert_matches, launched_kernel, special_rows
from plans import H200, SHAPES, plan


# ------------------------------------------------------------------ the shape (CPU)
@pytest.mark.parametrize("elem_bytes", [4, 2])
@pytest.mark.parametrize("evict_first", [True, False], ids=["evict-first", "plain"])
def test_a_tile_fits_its_ctas_batch_and_target_slots(elem_bytes, evict_first):
    shapes = SHAPES + [(65536, 1000), (3000, 10), (200000, 12), (512, 77)]
    tiled = [(cols, p) for rows, cols in shapes if (p := plan(rows, cols, elem_bytes, evict_first)).family == constants.TILES]
    assert len(tiled) >= 6
    for cols, p in tiled:
        assert p.splits == 1 and p.group <= 32
        assert ((p.tile_rows - 1) * cols + cols) * elem_bytes <= launch_policy._TILE_BYTES
        assert p.tile_rows <= constants.THREADS * constants.TILE_TARGETS


def test_short_rows_are_staged_in_tiles_that_fill_the_gpu():
    p = plan(1000000, 10, 2, False)  # 20-byte rows: a thread per row, tiles of whole sweeps
    assert p.group == 1 and p.tile_rows % constants.THREADS == 0 and p.chunks > 132 * constants.CTAS_PER_SM
    p = plan(65536, 1000, 2, False)  # 2000-byte rows: 16 to a 32 KB tile, 16 threads each
    assert p.tile_rows == 16 and p.group == 16 and p.chunks == 4096
    p = plan(4096, 129, 4, False)  # a small problem: tiles shrink until every CTA has one
    assert p.grid == p.chunks > 0.9 * 132 * constants.CTAS_PER_SM and p.group * p.tile_rows <= constants.THREADS
    assert plan(2, 4096, 2, False).family != constants.TILES  # 8 KB: too long to stage


def test_tiles_of_many_rows_take_whole_sweeps_that_even_out_the_ctas():
    """A thread per row, a row per sweep: tiles of whole sweeps (256 rows), as many as leave the
    busiest of the 396 CTAs the fewest sweeps in all, the larger tile on a tie."""
    sweep = constants.THREADS
    assert sweep == 256 and constants.CTAS_PER_SM == 3  # the figures below
    for rows, cols, elem_bytes, tile_rows in [
        (1000000, 10, 2, 2 * sweep),  # 1024 rows fit: 977 tiles, 3 to the busiest CTA, 12 sweeps; 1954 tiles of 2: 10
        (1000000, 10, 4, 2 * sweep),  # 819 fit: 1303 tiles of 3 sweeps, 4 to a CTA, 12; 1954 of 2: 10
        (4000000, 10, 2, 4 * sweep),  # 3907 tiles of 4 sweeps, 10 to a CTA, 40: nothing smaller has fewer
        (500000, 31, 2, sweep),       # 528 fit: 977 tiles of 2 sweeps, 3 to a CTA, 6; 1954 of 1: 5
        (300000, 20, 2, 3 * sweep),   # one tile a CTA: 391 tiles of 3 sweeps
        (2000000, 24, 4, sweep),      # rows of 6 vectors (the vector sweeps): 341 fit, one sweep
    ]:
        p = plan(rows, cols, elem_bytes, False)
        assert p.group == 1 and p.tile_rows == tile_rows and p.chunks == -(-rows // tile_rows), (rows, cols, p)
    assert plan(100000, 10, 4, False).tile_rows == 253  # fewer rows than threads per CTA: one tile each


def test_evict_first_tiles_of_long_enough_rows_run_fewer_ctas():
    fewer, every = 132 * launch_policy._EVICT_FIRST_TILE_CTAS, 132 * constants.CTAS_PER_SM
    assert fewer < every
    for elem_bytes in (4, 2):  # 2000- and 4000-byte rows
        assert plan(65536, 1000, elem_bytes, True).grid == fewer
        assert plan(65536, 1000, elem_bytes, False).grid == every
    assert plan(262144, 250, 2, True).grid == every  # 500-byte rows: tiles of much arithmetic
    assert plan(1000000, 10, 4, True).grid == every
    p = plan(4096, 129, 4, True)  # still one wave: tiles of 16 rows, not 11
    assert p.grid == p.chunks <= fewer and p.tile_rows == 16
    p = plan(8192, 300, 4, True)  # fewer CTAs would need a wave and a bit: every CTA
    assert p == plan(8192, 300, 4, False)._replace(evict_first=True) and p.grid == p.chunks > fewer
    # Where memory is fast, evict-first tiles keep every CTA.
    assert plan(65536, 1000, 2, True, on=H200).grid == every


def test_rows_far_apart_are_not_staged():
    assert plan(300, 1000, 4, False, stride=1003).family == constants.TILES  # a small gap is read along
    assert plan(300, 1000, 4, False, stride=10000).family == constants.ROWS  # a large one is not
    assert plan(100, 10, 4, False, stride=0).family == constants.TILES  # every row the same memory


@pytest.mark.parametrize("elem_bytes", [4, 2])
def test_sweeps_by_row_length_and_pair_alignment(elem_bytes):
    """Rows of 4 vectors or more: vector sweeps. Shorter: pairs where rows a thread each (group 1)
    have an even length and stride and start on a pair's boundary; else element by element."""
    per_vec, pair = 16 // elem_bytes, 2 * elem_bytes
    sweeps = launch_policy._sweeps
    assert sweeps(4 * per_vec, 4 * per_vec, elem_bytes, 1, 0) == constants.VECTOR_SWEEPS
    assert sweeps(12, 12, elem_bytes, 1, 0) == constants.PAIR_SWEEPS
    assert sweeps(12, 12, elem_bytes, 1, pair) == constants.PAIR_SWEEPS      # a pair past the 16-byte grid
    assert sweeps(12, 12, elem_bytes, 1, elem_bytes) == constants.ELEMENT_SWEEPS  # an odd start
    assert sweeps(12, 13, elem_bytes, 1, 0) == constants.ELEMENT_SWEEPS      # an odd stride
    assert sweeps(11, 11, elem_bytes, 1, 0) == constants.ELEMENT_SWEEPS      # an odd width
    assert sweeps(12, 12, elem_bytes, 2, 0) == constants.ELEMENT_SWEEPS      # a group per row


# ------------------------------------------------------------------ the cases (GPU)
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_short_rows_in_pairs_only_where_every_row_starts_on_a_pair(model, dtype):
    """Short rows a thread each are read from shared memory two elements a load where every row
    starts on a pair's boundary (4 bytes in 16-bit, 8 in float32) and has an even length, wherever
    the tile starts against the 16-byte grid; any other view takes the element sweeps. Both give
    the float64 loss."""
    rows, cols = PATHS["tiled short, thread per row"]
    t = targets(rows, cols)
    wide = logits(rows + 1, cols + 4, dtype)
    flat = logits(1, rows * cols + 2, dtype)[0]
    cases = [
        ("contiguous", logits(rows, cols, dtype), True),
        ("even row stride", wide[:rows, :cols], True),
        ("a pair past the 16-byte grid", wide[1:, 2:cols + 2], True),
        ("dense, a pair past the grid", flat[2:].view(rows, cols), True),
        ("odd start", wide[:rows, 1:cols + 1], False),
        ("odd row stride", logits(rows, cols + 1, dtype)[:, :cols], False),
        ("odd width", logits(rows, cols + 1, dtype), False),
    ]
    for name, x, pairs in cases:
        out = []
        family, args = launched_kernel(lambda: out.append(model(x, t)))
        assert family == "tiles" and args["sweeps"] == str(constants.PAIR_SWEEPS if pairs else constants.ELEMENT_SWEEPS), (name, args)
        assert_matches(out[0], x, t)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("row", range(1, 6))
def test_a_special_row_among_short_rows_of_a_thread_each(model, row, dtype):
    """One of special_rows at a random place among short rows that take a thread each: it poisons
    the mean, or does not, as in PyTorch."""
    rows, cols = PATHS["tiled short, thread per row"]
    special, special_targets = special_rows(cols)
    x, t = logits(rows, cols, torch.float32), targets(rows, cols)
    at = int(torch.randint(0, rows, ()))
    x[at], t[at] = special[row], special_targets[row]
    x = x.to(dtype)
    expected = torch.nn.functional.cross_entropy(x.float(), t)
    rtol = 1e-5 if dtype == torch.float32 else 1e-2  # a 16-bit result
    torch.testing.assert_close(model(x, t).float(), expected, equal_nan=True, rtol=rtol, atol=0)
