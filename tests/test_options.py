"""PyTorch's options weight, ignore_index, reduction ("mean", "sum", "none") and label_smoothing,
and z_loss and the per-row log-sum-exp beyond them, through ModelNew and cross_entropy: the options build (kOptions)
in every kernel family, against float64. On the CPU, the API's checks, the float64 reference
against PyTorch's own, and the options build's boundary."""
import inspect
import math

import pytest
import torch

import crossent
from crossent import build, inputs, params

from cases import DTYPES, PATHS, logits, targets, views
from cases import expected_loss as expected
from gpu_checks import RTOL

# Every family: PATHS (tiles in three sweeps, rows in registers, row batches, one row), rows split
# into segments, one class, no rows.
SHAPES = list(PATHS.values()) + [(16, 256000), (3, 100003), (1, 40000), (5, 1), (0, 17)]
IGNORE_INDICES = [-100, 3, -1, 2**40]


# ------------------------------------------------------------------ the API (CPU)
def test_the_signatures_are_pytorchs():
    """PyTorch's parameters in PyTorch's order, then ours, by keyword only: cross_entropy as
    F.cross_entropy, CrossEntropyLoss as nn.CrossEntropyLoss; ModelNew as KernelBench builds it."""
    ours = ["z_loss", "softcap", "return_lse", "inplace"]
    for fn, theirs in [(crossent.cross_entropy, torch.nn.functional.cross_entropy),
                       (crossent.CrossEntropyLoss, torch.nn.CrossEntropyLoss)]:
        params, pytorch = inspect.signature(fn).parameters, inspect.signature(theirs).parameters
        assert list(params) == list(pytorch) + ours
        assert all(params[k].default == pytorch[k].default for k in pytorch)
        assert all(params[k].kind is inspect.Parameter.KEYWORD_ONLY for k in ours)
    defaults = {k: v.default for k, v in inspect.signature(crossent.ModelNew).parameters.items()}
    assert defaults == {"weight": None, "ignore_index": -100, "reduction": "mean", "label_smoothing": 0.0,
                        "z_loss": 0.0, "softcap": None, "inplace": False, "check_targets": None}


def test_the_defaults_are_kernelbenchs_problem_and_anything_else_an_option():
    assert crossent.ModelNew()._options is inputs.DEFAULTS
    assert inputs.check_options() is inputs.DEFAULTS and inputs.check_options(ignore_index=-100) is inputs.DEFAULTS
    for kwargs in [{"ignore_index": 0}, {"reduction": "sum"}, {"z_loss": 1e-4}, {"return_lse": True},
                   {"weight": torch.ones(3)}, {"label_smoothing": 0.1}, {"softcap": 30.0}]:
        assert inputs.check_options(**kwargs) is not inputs.DEFAULTS, kwargs


def test_the_defaults_path_gives_what_the_full_checks_give():
    """check_options' path for a call that passes no option, against its full checks: each argument in
    the defaults' other spellings and in what only looks like them, the same options or the same error."""
    class Index:
        def __index__(self):
            return -100

    class Name(str):
        pass

    values = {"weight": [None, [1.0]], "ignore_index": [-100, -100.0, True, Index(), torch.tensor(-100), 2**63, "x"],
              "reduction": ["mean", Name("mean"), "MEAN", ["mean"], None],
              "z_loss": [0, 0.0, -0.0, False, "0", math.nan, -10**400, torch.tensor(0.0), 1e-4],
              "return_lse": [False, 0, None, True],
              "label_smoothing": [0, 0.0, -0.0, -0.5, -10**400, math.nan, False, "0", 1.5],
              "softcap": [None, 0, 30.0]}
    defaults = {"weight": None, "ignore_index": -100, "reduction": "mean", "z_loss": 0.0, "return_lse": False,
                "label_smoothing": 0.0, "softcap": None}

    def outcome(check, kwargs):
        try:
            options = check(**kwargs)
        except Exception as e:  # noqa: BLE001 - the error is what is compared
            return type(e), str(e)
        return options is inputs.DEFAULTS, options

    for name, alternatives in values.items():
        for value in alternatives:
            kwargs = {**defaults, name: value}
            assert outcome(inputs.check_options, kwargs) == outcome(inputs._checked_options, kwargs), kwargs


def test_modelnew_keeps_the_weight_as_a_buffer():
    """As PyTorch's loss module: moved and saved with the module; the other options are fixed."""
    w = torch.rand(5)
    model = crossent.ModelNew(w, 3, "sum", z_loss=0.5, softcap=30)
    assert model.weight is w and "weight" in dict(model.named_buffers()) and "weight" in model.state_dict()
    assert (model.ignore_index, model.reduction, model.z_loss, model.softcap) == (3, "sum", 0.5, 30.0)
    assert crossent.ModelNew().softcap is None
    assert model.to(torch.float64).weight.dtype == torch.float64
    with pytest.raises(AttributeError):
        model.reduction = "none"
    assert crossent.ModelNew().weight is None and "weight" not in crossent.ModelNew().state_dict()


def test_options_pytorch_rejects_raise_before_any_launch():
    with pytest.raises(ValueError, match="elementwise_mean is not a valid value for reduction"):
        crossent.ModelNew(reduction="elementwise_mean")
    with pytest.raises(TypeError, match="ignore_index must be an integer"):
        crossent.ModelNew(ignore_index=1.5)
    with pytest.raises(TypeError, match="ignore_index must be an integer"):
        crossent.ModelNew(ignore_index=True)
    class Index:  # an integer type other than int, as NumPy's int64
        def __index__(self):
            return 7
    assert crossent.ModelNew(ignore_index=Index()).ignore_index == 7
    with pytest.raises(TypeError, match="ignore_index must be an int64 integer"):
        crossent.ModelNew(ignore_index=2**63)
    with pytest.raises(ValueError, match="not a valid value for reduction"):
        crossent.cross_entropy(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), reduction="avg")
    with pytest.raises(TypeError, match="weight must be a tensor or None; got list"):
        crossent.ModelNew(weight=[1.0, 2.0])
    for z in [math.inf, math.nan]:
        with pytest.raises(ValueError, match="z_loss must be a finite number"):
            crossent.cross_entropy(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), z_loss=z)
    for cap in [0, -1.0, math.inf, math.nan, 1e-39, 1e39]:  # float32 normal numbers above 0
        with pytest.raises(ValueError, match="softcap must be None or a positive number"):
            crossent.ModelNew(softcap=cap)
    for name, value in [("z_loss", "0.1"), ("z_loss", True), ("softcap", "30"), ("softcap", True),
                        ("label_smoothing", "0.1"), ("z_loss", [0.1])]:  # unhashable too
        with pytest.raises(TypeError, match=f"{name} must be a number"):
            crossent.ModelNew(**{name: value})
    with pytest.raises(RuntimeError, match="label_smoothing must be between 0.0 and 1.0"):
        crossent.ModelNew(label_smoothing=1.5)
    for eps in [-0.1, math.nan]:  # as in PyTorch: no smoothing
        assert crossent.ModelNew(label_smoothing=eps)._options is inputs.DEFAULTS
    assert crossent.ModelNew(label_smoothing=1).label_smoothing == 1.0
    assert crossent.ModelNew(torch.ones(3), label_smoothing=0.1).label_smoothing == 0.1


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("ignore_index", [-100, 2])
def test_the_float64_reference_is_pytorchs(reduction, ignore_index):
    x, t, w = torch.randn(40, 7, dtype=torch.float64), torch.randint(0, 7, (40,)), torch.rand(7, dtype=torch.float64)
    t[::3] = ignore_index
    for weight in [None, w]:
        want = torch.nn.functional.cross_entropy(x, t, weight, ignore_index=ignore_index, reduction=reduction)
        torch.testing.assert_close(expected(x, t, ignore_index, reduction, weight), want, rtol=1e-12, atol=1e-12)
        want = torch.nn.functional.cross_entropy(x[0], t[1], weight, ignore_index=ignore_index, reduction=reduction)
        torch.testing.assert_close(expected(x[0], t[1], ignore_index, reduction, weight), want, rtol=1e-12, atol=0,
                                   equal_nan=True)  # t[1] may be the ignore index: a mean of nothing
    for eps in [0.1, 1.0]:
        for weight in [None, w]:
            want = torch.nn.functional.cross_entropy(x, t, weight, ignore_index=ignore_index, reduction=reduction,
                                                     label_smoothing=eps)
            got = expected(x, t, ignore_index, reduction, weight, label_smoothing=eps)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
            want = torch.nn.functional.cross_entropy(x[0], t[1], weight, ignore_index=ignore_index, reduction=reduction,
                                                     label_smoothing=eps)
            got = expected(x[0], t[1], ignore_index, reduction, weight, label_smoothing=eps)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, equal_nan=True)
    lse = torch.logsumexp(x, 1)
    ce = torch.nn.functional.cross_entropy(x, t, ignore_index=ignore_index, reduction="none")
    torch.testing.assert_close(expected(x, t, ignore_index, "none", z_loss=0.25),
                               torch.where(t != ignore_index, ce + 0.25 * lse**2, 0.0))


def test_the_options_build_keeps_the_default_builds_fields_in_place():
    """Its fields come last, after the stream, and only its source reads them (kOptions)."""
    names = [name for name, *_ in params.PARAMS]
    assert names[names.index("stream") + 1:] == [
        "losses", "weight", "weight_phases", "weight_exact", "row_state", "probs", "grad", "grad_out", "grad_scale",
        "grad_lse", "weight_total", "grad_probs", "grad_in", "terms", "lse", "ignore_index", "reduction", "float32_out",
        "z_loss", "label_smoothing", "smoothing_per_class", "probs_stride", "class_stride", "probs_dtype",
        "grad_dtype", "softcap", "softcap_rate", "grad_row_stride", "class_start", "classes", "ranks"]
    assert names[:names.index("stream")] == ["logits", "targets", "out", "counter", "ignored_rows", "exact",
                                              "seg_partials", "rows", "cols", "row_stride", "target_stride", "items",
                                              "chunks", "splits", "seg_len", "group", "chunk_rounds", "tile_rows",
                                              "target_bytes", "family", "sweeps", "batch_rows", "dtype", "grid",
                                              "device", "lead_256", "evict_first"]
    assert "constexpr bool kOptions = false;" in build.cuda_source()
    assert "constexpr bool kOptions = true;" in build.cuda_source(options=True)


# ------------------------------------------------------------------ on the GPU
def assert_close(got, want, dtype):
    """got against float64's result rounded once to dtype (a 16-bit sum past the dtype's range is inf)."""
    assert got.shape == want.shape and got.dtype == dtype, (got.shape, want.shape, got.dtype)
    got, want = got.double(), want.to(dtype).double()
    assert torch.equal(torch.isnan(got), torch.isnan(want)), (got, want)
    keep = ~torch.isnan(want)
    torch.testing.assert_close(got[keep], want[keep], rtol=RTOL[dtype], atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("ignore_index", IGNORE_INDICES)
def test_every_family_takes_the_options(dtype, reduction, ignore_index):
    model = crossent.ModelNew(ignore_index=ignore_index, reduction=reduction)
    for rows, cols in SHAPES:
        x, t = logits(rows, cols, dtype), targets(rows, cols)
        if rows:
            t[::4] = ignore_index  # a quarter of the rows skipped
        assert_close(model(x, t), expected(x, t, ignore_index, reduction), dtype)
        assert_close(crossent.cross_entropy(x, t, ignore_index=ignore_index, reduction=reduction),
                     expected(x, t, ignore_index, reduction),
                     dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_views_unbatched_input_and_int32_targets(reduction):
    for dtype in DTYPES.values():
        for name, x in views(64, 1003, dtype):
            t = targets(x.shape[0], x.shape[1], torch.int32)
            t[5] = 7
            assert_close(crossent.cross_entropy(x, t, ignore_index=7, reduction=reduction), expected(x, t, 7, reduction), dtype)
        x, t = logits(1, 4096, dtype)[0], targets(1, 4096)[0]
        assert_close(crossent.cross_entropy(x, t, reduction=reduction), expected(x, t, -100, reduction), dtype)


@pytest.mark.gpu
def test_every_row_ignored():
    """Nothing counted: the mean is 0 / 0 = NaN, the sum 0, and every row's loss 0, as in PyTorch."""
    for rows, cols in SHAPES:
        x, t = logits(rows, cols, torch.float32), targets(rows, cols)
        t[:] = 5
        assert torch.isnan(crossent.cross_entropy(x, t, ignore_index=5))
        assert crossent.cross_entropy(x, t, ignore_index=5, reduction="sum").item() == 0
        assert torch.equal(crossent.cross_entropy(x, t, ignore_index=5, reduction="none"), torch.zeros(x.shape[0], device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("ignore_index", [-100, -1, 2**40, -100 - 2**32])
def test_int32_targets_compare_with_the_ignore_index_in_64_bits(ignore_index):
    """An int32 target is ignored only where it equals ignore_index as an integer: one that int32
    cannot hold ignores nothing, and the opt-in check still names the bad rows."""
    x, t = logits(1000, 77, torch.float32), targets(1000, 77, torch.int32)
    if -2**31 <= ignore_index < 2**31:
        t[::4] = ignore_index
    want = expected(x, t.long(), ignore_index, "none")
    assert_close(crossent.cross_entropy(x, t, ignore_index=ignore_index, reduction="none"), want, torch.float32)
    t[1] = -100  # ignored only where ignore_index is -100
    model = crossent.ModelNew(ignore_index=ignore_index, reduction="sum", check_targets=True)
    if ignore_index == -100:
        assert_close(model(x, t), expected(x, t.long(), ignore_index, "sum"), torch.float32)
    else:
        with pytest.raises(IndexError, match=r"targets\[1\] = -100 is outside \[0, 77\)"):
            model(x, t)


@pytest.mark.gpu
def test_bad_targets_give_nan_in_their_row():
    x, t = logits(1000, 77, torch.float32), targets(1000, 77)
    t[10], t[20] = 77, -5
    losses = crossent.cross_entropy(x, t, ignore_index=3, reduction="none")
    assert torch.isnan(losses[10]) and torch.isnan(losses[20]) and torch.isfinite(losses).sum() == 998
    assert torch.isnan(crossent.cross_entropy(x, t, ignore_index=3, reduction="sum"))
    with pytest.raises(IndexError, match=r"targets\[10\] = 77 is outside \[0, 77\) and is not the ignore index 3"):
        crossent.ModelNew(ignore_index=3, reduction="sum", check_targets=True)(x, t)


@pytest.mark.gpu
def test_sum_is_deterministic_and_the_defaults_never_touch_the_options_build(policy):
    x, t = logits(4096, 32000, torch.bfloat16), targets(4096, 32000)
    first = crossent.cross_entropy(x, t, reduction="sum")
    assert all(torch.equal(first, crossent.cross_entropy(x, t, reduction="sum")) for _ in range(5))
    # reduction mean with ignore_index -100 is KernelBench's problem: the default build alone
    policy("options_extension", lambda: pytest.fail("the defaults took the options build"))
    for dtype in DTYPES.values():
        y = x.to(dtype)
        assert torch.isfinite(crossent.cross_entropy(y, t)) and torch.isfinite(crossent.ModelNew()(y, t))


def class_weights(cols, dtype):
    """Positive weights, a few of them 0 (rows of such a class count for nothing, divisor included)."""
    w = torch.rand(cols, device="cuda") + 0.05
    w[::7] = 0
    return w.to(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("ignore_index", [-100, 3])
def test_every_family_takes_class_weights(dtype, reduction, ignore_index):
    for rows, cols in SHAPES:
        x, t, w = logits(rows, cols, dtype), targets(rows, cols), class_weights(cols, dtype)
        if rows:
            t[::4] = ignore_index
        want = expected(x, t, ignore_index, reduction, w)
        assert_close(crossent.ModelNew(w, ignore_index, reduction)(x, t), want, dtype)
        assert_close(crossent.cross_entropy(x, t, w, ignore_index=ignore_index, reduction=reduction), want, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_z_loss_and_every_rows_log_sum_exp(dtype, reduction):
    """Every row's log-sum-exp in float32, ignored rows and bad targets too, with z_loss and weights."""
    for rows, cols in SHAPES:
        x, t = logits(rows, cols, dtype), targets(rows, cols)
        if rows:
            t[::4] = -100
            if reduction == "none":
                t[1::9] = cols  # bad: NaN in its row (and in the sum and the mean, so only here)
        for weight in [None, class_weights(cols, dtype)]:
            loss, lse = crossent.cross_entropy(x, t, weight, reduction=reduction, z_loss=1e-3, return_lse=True)
            assert_close(loss, expected(x, t, -100, reduction, weight, 1e-3), dtype)
            assert lse.dtype == torch.float32 and lse.shape == (rows,)
            torch.testing.assert_close(lse.double(), torch.logsumexp(x.double(), 1), rtol=1e-6, atol=1e-6)
        assert_close(crossent.ModelNew(reduction=reduction, z_loss=0.5)(x, t), expected(x, t, -100, reduction,
                                                                                         z_loss=0.5), dtype)


@pytest.mark.gpu
def test_unbatched_input_and_views_with_every_option():
    for dtype in DTYPES.values():
        x, t, w = logits(1, 4096, dtype)[0], targets(1, 4096)[0], class_weights(4096, dtype)
        for reduction in ["none", "sum", "mean"]:
            loss, lse = crossent.cross_entropy(x, t, w, reduction=reduction, z_loss=0.1, return_lse=True)
            assert_close(loss, expected(x, t, -100, reduction, w, 0.1), dtype)
            assert lse.shape == () and abs(lse.item() - torch.logsumexp(x.double(), 0).item()) < 1e-5
        for name, v in views(64, 1003, dtype):
            t, w = targets(64, 1003, torch.int32), class_weights(1003, dtype)
            assert_close(crossent.cross_entropy(v, t, w, z_loss=0.1), expected(v, t, -100, "mean", w, 0.1), dtype)


@pytest.mark.gpu
def test_weighted_mean_edge_cases():
    """A lone row whose class weighs 0 and a batch whose counted rows all do: 0 / 0 = NaN, as in
    PyTorch; every row ignored: NaN mean, 0 sum."""
    for rows, cols in [(1, 4096), (1000, 10), (64, 5000), (16, 256000)]:
        x, t, w = logits(rows, cols, torch.float32), targets(rows, cols), class_weights(cols, torch.float32)
        t[:] = 7  # weight 0
        assert torch.isnan(crossent.cross_entropy(x, t, w))
        assert crossent.cross_entropy(x, t, w, reduction="sum").item() == 0
        t[:] = -100
        assert torch.isnan(crossent.cross_entropy(x, t, w)) and crossent.cross_entropy(x, t, w, reduction="sum") == 0


@pytest.mark.gpu
def test_weighted_mean_is_deterministic():
    """The weights' sum is exact, as the losses' is: the same bits every run (test_exact_sum varies the
    schedule)."""
    for rows, cols in [(4096, 32000), (16, 256000), (1000000, 10), (4000, 4096)]:
        x, t, w = logits(rows, cols, torch.bfloat16), targets(rows, cols), class_weights(cols, torch.bfloat16)
        first = crossent.cross_entropy(x.float(), t, w.float(), z_loss=1e-4)
        assert all(torch.equal(first, crossent.cross_entropy(x.float(), t, w.float(), z_loss=1e-4)) for _ in range(5))


@pytest.mark.gpu
def test_weights_pytorch_rejects_raise_and_the_gpu_carries_on():
    x, t = logits(8, 5, torch.bfloat16), targets(8, 5)
    with pytest.raises(RuntimeError, match="expected scalar type"):  # PyTorch's own: another dtype goes to it
        crossent.cross_entropy(x, t, torch.ones(5, device="cuda"))
    with pytest.raises(RuntimeError, match="expected scalar type torch.bfloat16 but found torch.float32"):
        crossent.ModelNew(torch.ones(5, device="cuda"))(x, t)
    with pytest.raises(RuntimeError, match=r"weight tensor should be defined either for all 5 classes or no classes "
                                         r"but got weight tensor of shape: \[5, 1\]"):
        crossent.cross_entropy(x, t, torch.ones(5, 1, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="weight is on cpu"):
        crossent.cross_entropy(x, t, torch.ones(5, dtype=torch.bfloat16))
    w = torch.ones(10, device="cuda", dtype=torch.bfloat16)[::2]  # a view with a stride: copied
    assert_close(crossent.cross_entropy(x, t, w), expected(x, t, weight=w), torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("eps", [0.1, 1.0])
def test_every_shape_takes_label_smoothing(dtype, reduction, eps):
    """Tiles and whole rows in registers (the families label smoothing takes), every shape, with a
    quarter of the rows ignored, z_loss and every row's log-sum-exp beside it."""
    for rows, cols in SHAPES:
        x, t = logits(rows, cols, dtype), targets(rows, cols)
        if rows:
            t[::4] = -100
        want = expected(x, t, -100, reduction, label_smoothing=eps)
        assert_close(crossent.ModelNew(reduction=reduction, label_smoothing=eps)(x, t), want, dtype)
        t = t.masked_fill(t == -100, 3)  # the same rows ignored, by another index
        loss, lse = crossent.cross_entropy(x, t, ignore_index=3, reduction=reduction, label_smoothing=eps,
                                           z_loss=1e-3, return_lse=True)
        assert_close(loss, expected(x, t, 3, reduction, z_loss=1e-3, label_smoothing=eps), dtype)
        torch.testing.assert_close(lse.double(), torch.logsumexp(x.double(), 1), rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_label_smoothing_views_unbatched_and_special_values():
    """Rows off the 16-byte grid and unbatched input; a -inf logit makes its row's loss +inf (the
    smoothing term sums -log_softmax over every class), a row of -inf is NaN; logits that share a
    large offset keep float32's accuracy (the gaps are summed from the row's max)."""
    for dtype in DTYPES.values():
        for name, v in views(64, 1003, dtype):
            t = targets(64, 1003, torch.int32)
            assert_close(crossent.cross_entropy(v, t, label_smoothing=0.2),
                         expected(v, t, label_smoothing=0.2), dtype)
        x, t = logits(1, 4096, dtype)[0], targets(1, 4096)[0]
        assert_close(crossent.cross_entropy(x, t, label_smoothing=0.2), expected(x, t, label_smoothing=0.2), dtype)
    for rows, cols in [(1000, 77), (64, 5000), (3, 100003)]:
        x, t = logits(rows, cols, torch.float32), targets(rows, cols)
        x[0, 5] = -math.inf
        x[1] = -math.inf
        got = crossent.cross_entropy(x, t, reduction="none", label_smoothing=0.1)
        assert got[0] == math.inf and torch.isnan(got[1]) and torch.isfinite(got[2:]).all()
        assert_close(got[2:], expected(x[2:], t[2:], reduction="none", label_smoothing=0.1), torch.float32)
        y = logits(rows, cols, torch.float32, scale=1.0) + 3000.0
        assert_close(crossent.cross_entropy(y, t, reduction="none", label_smoothing=0.3),
                     expected(y, t, reduction="none", label_smoothing=0.3), torch.float32)


@pytest.mark.gpu
def test_label_smoothing_is_deterministic():
    for rows, cols in [(4096, 32000), (1000000, 10), (4000, 4096)]:
        x, t = logits(rows, cols, torch.bfloat16), targets(rows, cols)
        first = crossent.cross_entropy(x, t, label_smoothing=0.1)
        assert all(torch.equal(first, crossent.cross_entropy(x, t, label_smoothing=0.1)) for _ in range(5))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_class_weights_with_rows_that_overlap_in_memory(dtype):
    """An expanded tensor (row stride 0) of rows longer than the tiles' class-weight table."""
    for cols in [1000, 3000, 4000]:
        x, t, w = logits(1, cols, dtype).expand(2000, cols), targets(2000, cols), class_weights(cols, dtype)
        assert_close(crossent.cross_entropy(x, t, w, reduction="none"), expected(x, t, reduction="none", weight=w),
                     dtype)


@pytest.mark.gpu
def test_the_last_16_bit_class_weight_at_the_start_of_a_word():
    """Rows in registers copy the 4-byte word holding a row's weight; the last of an odd number of
    16-bit weights starts one, which would reach past the tensor, and is loaded alone."""
    x, w = logits(64, 5001, torch.bfloat16), class_weights(5001, torch.bfloat16)
    t = torch.full((64,), 5000, device="cuda")
    w[5000] = 0.75
    assert w.data_ptr() % 4 == 0 and (w.data_ptr() + 2 * 5000) % 4 == 0
    assert_close(crossent.cross_entropy(x, t, w, reduction="none"), expected(x, t, reduction="none", weight=w),
                 torch.bfloat16)
