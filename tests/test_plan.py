"""The launch policy (_plan): every shape gets a legal launch that covers every column once."""
import itertools

import pytest

import model_new
from model_new import _plan

SHAPES = [(0, 7), (1, 1), (1, 4096), (3, 5), (4096, 129), (32768, 4096), (4096, 32000), (8192, 50257),
          (8192, 128256), (16, 256000), (1000000, 10), (65536, 1000), (2, 3 * 2**30), (131, 777777)]


@pytest.mark.parametrize("rows, cols", SHAPES)
@pytest.mark.parametrize("elem_bytes", [4, 2])
@pytest.mark.parametrize("sms", [132, 108, 1])
def test_plan_is_legal(rows, cols, elem_bytes, sms):
    p = _plan(rows, cols, elem_bytes, sms)
    per_vec = 16 // elem_bytes
    assert 1 <= p.grid <= max(1, sms * model_new._CTAS_PER_SM)
    assert p.group & (p.group - 1) == 0 and 1 <= p.group <= model_new._THREADS
    assert p.seg_len % per_vec == 0 and p.seg_len <= model_new._MAX_SEG
    # segments tile the row exactly: none empty, none missing
    assert (p.splits - 1) * p.seg_len < cols <= p.splits * p.seg_len
    # items per CTA fit in a 32-bit count
    assert rows * p.splits // p.grid < 2**31


def test_headline_shape_fills_the_gpu_with_whole_rows():
    p = _plan(32768, 4096, 4, 132)
    assert p.splits == 1 and p.grid >= 0.95 * 132 * model_new._CTAS_PER_SM
    assert p.group * model_new._VECS_PER_THREAD * 16 >= 4096 * 4  # each thread's share fits its vector budget


@pytest.mark.parametrize("rows, cols", [r for r in SHAPES if r[0] * r[1] >= 2**24])
@pytest.mark.parametrize("elem_bytes", [4, 2])
def test_last_round_is_not_mostly_idle(rows, cols, elem_bytes):
    p = _plan(rows, cols, elem_bytes, 132)
    slots = p.grid * (model_new._THREADS // p.group)  # items the grid takes per round
    items = rows * p.splits
    rounds = -(-items // slots)
    assert items / (rounds * slots) > 0.95


def test_few_long_rows_are_split_across_ctas():
    p = _plan(16, 256000, 4, 132)
    assert p.splits >= 8 and p.grid >= 128


def test_small_rows_use_small_groups():
    assert _plan(1000000, 10, 4, 132).group == 1
    assert _plan(65536, 1000, 4, 132).group <= 32


def test_workspace_layout_is_aligned():
    for rows, cols in itertools.product([1, 5, 70000], [3, 4096, 300000]):
        p = _plan(rows, cols, 4, 132)
        cta_off, seg_off = model_new._workspace_layout(p)
        assert cta_off % 16 == 0 and seg_off % 16 == 0 and seg_off >= cta_off + 8 * p.grid
