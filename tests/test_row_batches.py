"""Row batches (cross_entropy_row_batches_kernel): where one or two rows fill a CTA's batch of loads
exactly. Its launch shape on the CPU, its cases on the GPU."""
import pytest
import torch

from crossent import constants
from crossent import policy as launch_policy

from cases import DTYPES, logits
from gpu_checks import assert_matches, launched_kernel, spiked, spread_columns
from plans import SHAPES, gpu, plan


# ------------------------------------------------------------------ the shape (CPU)
@pytest.mark.parametrize("elem_bytes", [4, 2])
@pytest.mark.parametrize("sms", [132, 108, 1, 1000])
def test_whole_rows_fill_a_batch_and_every_cta_gets_several(elem_bytes, sms):
    shapes = SHAPES + [(65536, 4096), (32768, 2048 * 4 // elem_bytes)]
    batched = [(cols, p) for rows, cols in shapes if (p := plan(rows, cols, elem_bytes, on=gpu(sms))).family == constants.ROW_BATCHES]
    assert len(batched) >= 2
    for cols, p in batched:
        assert p.splits == 1 and p.batch_rows in (1, 2) and p.group == constants.THREADS
        assert p.batch_rows * cols * elem_bytes == launch_policy._ROW_BATCH_VECS * 16
        assert p.chunks >= launch_policy._ROW_BATCH_MIN_CHUNKS * p.grid


def test_headline_shape_fills_the_gpu_with_whole_rows():
    for elem_bytes, batch_rows in [(4, 1), (2, 2)]:  # a 16 KB batch: one fp32 row, two 16-bit rows
        for evict_first in (False, True):
            p = plan(32768, 4096, elem_bytes, evict_first)
            assert p.family == constants.ROW_BATCHES and p.grid == 132 * constants.CTAS_PER_SM
            assert p.batch_rows == batch_rows and p.chunks == 32768 // batch_rows


@pytest.mark.parametrize("rows, cols, stride, elem_bytes, offset, batch_rows", [
    (32768, 4096, 4096, 4, 0, 1), (32768, 2048, 2048, 4, 0, 2), (32768, 8192, 8192, 2, 0, 1),
    (4001, 4096, 4104, 2, 0, 2),   # padded rows on the 16-byte grid, and a last chunk of one row
    (32768, 4096, 4096, 4, 4, 0),  # the first logit off the 16-byte grid
    (32768, 4096, 4099, 4, 0, 0),  # rows off the 16-byte grid
    (32768, 4100, 4100, 4, 0, 0),  # rows that do not fill a batch exactly
    (32768, 1024, 1024, 4, 0, 0),  # four rows a batch: tiles
    (32768, 16384, 16384, 2, 0, 0),  # a row of two batches
    (1000, 4096, 4096, 4, 0, 0),   # fewer than 4 batches per CTA
])
def test_row_batches_where_rows_fill_a_batch(rows, cols, stride, elem_bytes, offset, batch_rows):
    assert launch_policy._batch_rows(rows, cols, stride, elem_bytes, gpu(), offset) == batch_rows
    p = plan(rows, cols, elem_bytes, stride=stride, offset=offset)
    assert (p.family == constants.ROW_BATCHES) == bool(batch_rows) and p.batch_rows == batch_rows


# ------------------------------------------------------------------ the cases (GPU)
@pytest.mark.gpu
@pytest.mark.parametrize("evict_first", [True, False], ids=["evict-first", "plain"])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_row_batches(model, policy, dtype, evict_first):
    """Rows that fill a CTA batch exactly go to the row-batch kernel: one fp32 row or two 16-bit rows
    of 4096 columns a batch, here 4001 of them, so the last batch has a row missing, contiguous and
    padded to a row stride on the 16-byte grid. Targets at both ends and a spread of columns put the
    target logit in every warp of a row; then a -inf target logit, a bad target, a NaN and ignored
    rows, each as PyTorch gives them."""
    policy("_evict_first", lambda *_: evict_first)
    rows, cols = 4001, 4096
    t = spread_columns(rows, cols)
    for x in (logits(rows, cols, dtype), logits(rows, cols + 8, dtype)[:, :cols]):
        x = spiked(x, t)
        out = []
        family, args = launched_kernel(lambda: out.append(model(x, t)))
        assert family == "row_batches" and args["evict_first"] == str(evict_first).lower(), args
        assert_matches(out[0], x, t)
        assert_matches(model(x[:rows - 1], t[:rows - 1]), x[:rows - 1], t[:rows - 1])  # every batch full
        ignored = t.clone()
        ignored[::3] = -100
        assert_matches(model(x, ignored), x, ignored)
        y = x.clone()
        y[rows - 1, t[rows - 1]] = float("-inf")  # the last row, alone in the last batch
        out = model(y, t)
        assert torch.isinf(out) and out > 0
        bad = t.clone()
        bad[5] = cols
        assert torch.isnan(model(x, bad))
        y = x.clone()
        y[7, 11] = float("nan")
        assert torch.isnan(model(y, t))
