"""One row (cross_entropy_one_row_kernel): a lone row of up to 128 KB, one CTA holding all of it.
Its launch shape on the CPU, its cases on the GPU."""
import pytest
import torch

from crossent import constants

from cases import DTYPES, logits, targets
from gpu_checks import assert_matches, plan_for, special_rows, spiked


# ------------------------------------------------------------------ the shape (CPU)
@pytest.mark.parametrize("elem_bytes", [4, 2])
def test_a_lone_row_of_up_to_128_kb_has_its_own_kernel(elem_bytes):
    from plans import plan
    per_vec = 16 // elem_bytes
    limit = constants.ONE_ROW_THREADS * constants.BATCH * per_vec  # 128 KB of whole vectors
    assert limit * elem_bytes == 128 << 10
    for cols, threads in [(1, 32), (3, 32), (4096, 4096 // per_vec // constants.BATCH),
                          (4099, 4096 // per_vec // constants.BATCH),
                          (limit // 2 + per_vec, constants.ONE_ROW_THREADS), (limit, constants.ONE_ROW_THREADS)]:
        for offset in (0, elem_bytes):  # wherever it starts: its elements outside whole vectors are one per thread
            p = plan(1, cols, elem_bytes, offset=offset)
            assert p.family == constants.ONE_ROW and p.group == threads and p.grid == p.chunks == 1, (cols, p)
            assert p.group * constants.BATCH >= cols // per_vec  # a batch a thread holds the row
    assert plan(1, limit + per_vec, elem_bytes).family == constants.ROWS  # longer: split
    assert plan(2, 4096, elem_bytes).family != constants.ONE_ROW  # two rows: the mean of two losses


# ------------------------------------------------------------------ the cases (GPU)
def one_row_columns(cols, per_vec):
    """Target columns for a lone row: both ends (the elements outside whole vectors where the row
    starts off the 16-byte grid) and 33 spread over it, which reach every slot of a thread's batch."""
    ends = set(range(min(cols, 2 * per_vec))) | set(range(max(0, cols - 2 * per_vec), cols))
    return sorted(ends | {round(k * (cols - 1) / 32) for k in range(33)})


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("cols", [1, 3, 9, 100, 4096, 4103, 32003, "limit", "past the limit"])
def test_one_row(model, dtype, cols):
    """Every start on the element grid, the target logit taken from every kind of place in the row
    (spiked: the loss is about 0 only where it is read from the right column), int32 targets, the
    unbatched form, and targets that give NaN. Past the limit the row is split (rows in registers)."""
    per_vec = 16 // torch.empty((), dtype=dtype).element_size()
    limit = constants.ONE_ROW_THREADS * constants.BATCH * per_vec
    cols = {"limit": limit, "past the limit": limit + per_vec}.get(cols, cols)
    flat = logits(1, cols + per_vec, dtype)[0]
    for offset in range(per_vec) if cols < 10000 else (0, 1, per_vec - 1):
        x = flat[offset:offset + cols].view(1, cols)
        assert (plan_for(x).family == constants.ONE_ROW) == (cols <= limit)
        for col in one_row_columns(cols, per_vec):
            t = torch.tensor([col], device="cuda")
            spiked(x, t)
            assert_matches(model(x, t), x, t)
        x.copy_(logits(1, cols, dtype))
        t = targets(1, cols, torch.int32)
        assert_matches(model(x, t), x, t)
        assert_matches(model(x[0], t[0]), x, t)  # logits (C,), a 0-dim target
        for bad in (-100, -1, cols, 2**40):
            assert torch.isnan(model(x, torch.tensor([bad], device="cuda")))


@pytest.mark.gpu
@pytest.mark.parametrize("row", range(6))
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("cols", [64, 5000])
def test_inf_and_nan_like_pytorch(model, row, dtype, cols):
    """Each special row alone; test_contract.py takes them two rows at a time through the other families."""
    x, t = special_rows(cols)
    x, t = x[row:row + 1].to(dtype), t[row:row + 1]
    expected = torch.nn.functional.cross_entropy(x.float(), t)
    got = model(x, t).float()
    assert torch.equal(torch.isnan(got), torch.isnan(expected)), (got, expected)
    if not torch.isnan(expected):
        assert torch.isinf(got) == torch.isinf(expected)
        assert torch.allclose(got, expected, rtol=1e-2), (got, expected)
