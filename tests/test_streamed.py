"""What the streamed family takes: class-probability targets, inputs (N, C, d1, ..., dk) whose
classes are strided in memory, class weights with label smoothing, and soft-capped logits, with
every option, against float64. On the CPU, the float64 reference against PyTorch's own, and the
policy's routing."""
import itertools
import math

import pytest
import torch

import crossent
from crossent import constants
from crossent import policy as launch_policy

from cases import DTYPES, logits, targets, views
from cases import expected_loss as expected
from gpu_checks import launched_kernel
from plans import GPU_PLANS, H100

REDUCTIONS = ["none", "sum", "mean"]
# Rows of every kind of stream: vectors and edges (C not a multiple of any vector width), short rows
# of a few lanes, long rows, one row, one class, none.
SHAPES = [(512, 77), (64, 5000), (4096, 129), (16, 25600), (3000, 10), (1, 4096), (7, 3), (5, 1), (0, 17)]
# (N, C, d1, ..., dk): strided classes, odd positions, one position, no positions, no samples; quads
# of positions whose classes fill one, two, or more stages than stream_quad keeps in flight.
POSITION_SHAPES = [(2, 5, 3, 4), (4, 21, 17, 9), (3, 7, 1000), (2, 19, 8, 16), (5, 1, 7), (6, 4, 1), (2, 3, 0, 4),
                   (0, 5, 3), (3, 8, 4, 4), (2, 16, 8), (2, 41, 4, 8), (3, 1, 8)]


def probabilities(shape, dtype, device="cuda"):
    """Rows of class probabilities along dim 1 (dim 0 for one row), some of them exactly 0."""
    dim = 1 if len(shape) > 1 else 0
    p = torch.softmax(torch.randn(shape, device=device) * 2, dim)
    return p.masked_fill(torch.rand(shape, device=device) < 0.1, 0.0).to(dtype)


def class_targets(shape, cols, ignore=0.25, device="cuda", ignore_index=-100):
    """Class indices for logits of `shape` ((N, C, d1, ...)): a share of them the ignore index."""
    positions = shape[:1] + shape[2:]
    t = torch.randint(0, cols, positions, device=device)
    return t.masked_fill(torch.rand(positions, device=device) < ignore, ignore_index)


def result_dtype(x, t):
    return torch.promote_types(x.dtype, t.dtype) if t.is_floating_point() else x.dtype


def assert_close(got, want, dtype, rtol=None):
    """got against float64's result rounded once to dtype."""
    assert got.shape == want.shape and got.dtype == dtype, (got.shape, want.shape, got.dtype, dtype)
    got, want = got.double(), want.to(dtype).double()
    assert torch.equal(torch.isnan(got), torch.isnan(want)), (got, want)
    keep = ~torch.isnan(want)
    rtol = rtol or {torch.float32: 2e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
    torch.testing.assert_close(got[keep], want[keep], rtol=rtol, atol=1e-5)


def check(x, t, **options):
    """cross_entropy(x, t, **options), and ModelNew with them, against float64."""
    want = expected(x, t, options.get("ignore_index", -100), options.get("reduction", "mean"), options.get("weight"),
                    options.get("z_loss", 0.0), options.get("label_smoothing", 0.0), options.get("softcap"))
    assert_close(crossent.cross_entropy(x, t, **options), want, result_dtype(x, t))
    module_options = {k: v for k, v in options.items() if k != "z_loss"}
    assert_close(crossent.ModelNew(**module_options, z_loss=options.get("z_loss", 0.0))(x, t), want,
                 result_dtype(x, t))


# ------------------------------------------------------------------ on the CPU
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_the_float64_reference_takes_probabilities_and_positions(reduction):
    f64 = torch.float64
    x, w = torch.randn(6, 7, dtype=f64), torch.rand(7, dtype=f64)
    p = probabilities((6, 7), f64, "cpu")
    x4, w4 = torch.randn(2, 5, 3, 4, dtype=f64), torch.rand(5, dtype=f64)
    p4, t4 = probabilities((2, 5, 3, 4), f64, "cpu"), class_targets((2, 5, 3, 4), 5, device="cpu")
    for (xs, ts, ws), eps in itertools.product([(x, p, w), (x[0], p[0], w), (x4, p4, w4), (x4, t4, w4)], [0.0, 0.3]):
        for weight in [None, ws]:
            want = torch.nn.functional.cross_entropy(xs, ts, weight, reduction=reduction, label_smoothing=eps)
            got = expected(xs, ts, reduction=reduction, weight=weight, label_smoothing=eps)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_the_float64_reference_caps_every_logit():
    x = torch.randn(6, 7, dtype=torch.float64) * 20
    x[0, 0], x[1, 1], x[2, 2] = -math.inf, math.inf, 1e30
    capped = 5.0 * torch.tanh(x / 5.0)
    for t in (torch.tensor([0, 1, 2, 3, 4, -100]), probabilities((6, 7), torch.float64, "cpu")):
        for reduction in REDUCTIONS:
            want = torch.nn.functional.cross_entropy(capped, t, reduction=reduction, label_smoothing=0.1)
            got = expected(x, t, reduction=reduction, label_smoothing=0.1, softcap=5.0)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_the_policy_streams_what_the_other_families_do_not_take():
    gpu, streamed = H100, constants.STREAMED
    plan_launch = launch_policy.plan_launch
    assert plan_launch(4096, 32000, 32000, 4, gpu, probs=True).family == streamed
    assert plan_launch(4096, 4096, 4096, 4, gpu, weighted=True, smoothed=True).family == streamed
    assert plan_launch(4096, 4096, 4096, 4, gpu, weighted=True).family != streamed
    assert plan_launch(4096, 4096, 4096, 4, gpu, smoothed=True).family != streamed
    assert plan_launch(4096, 4096, 4096, 4, gpu, capped=True).family == streamed
    assert plan_launch(1, 4096, 4096, 2, gpu, capped=True).family == streamed
    strided = plan_launch(8 * 512 * 512, 21, 21 * 512 * 512, 4, gpu, class_stride=512 * 512)
    assert strided.family == streamed and strided.group == 4 and strided.grid == launch_policy._max_grid(streamed, gpu)
    assert plan_launch(8 * 512 * 512, 21, 21 * 512 * 512, 2, gpu, class_stride=512 * 512, capped=True).group == 4
    # Quads of positions only where their logits share a load.
    for stride, offset, elem, probs, group in [(9, 0, 4, False, 1), (12, 4, 4, False, 1), (12, 8, 2, False, 4),
                                               (12, 4, 2, False, 1), (12, 0, 4, True, 1)]:
        assert plan_launch(3000, 21, 21 * stride, elem, gpu, offset, probs=probs, class_stride=stride).group == group
    # Contiguous rows: lanes enough for a batch of vectors each, at most a CTA; no more CTAs than chunks.
    for cols, elem, group in [(4096, 4, 32), (128256, 2, 256), (32000, 4, 256), (1000, 4, 8), (77, 4, 1), (10, 4, 1),
                              (1, 2, 1)]:
        plan = plan_launch(100000, cols, cols, elem, gpu, probs=True)
        assert plan.group == group, (cols, elem, plan)
    assert plan_launch(3, 4096, 4096, 4, gpu, probs=True).grid == 1  # a CTA's chunk is 8 such rows
    for name, other in GPU_PLANS.items():  # every CTA resident at once, on every GPU
        assert plan_launch(10**6, 21, 21, 4, other, class_stride=9).grid == launch_policy._max_grid(streamed, other), name
        # 16-bit quads with their staged copies too: fewer CTAs where shared memory runs out first.
        quads = plan_launch(10**6, 21, 21 * 512, 2, other, class_stride=512)
        per_cta = launch_policy._CTA_SHARED_BYTES[streamed] + 32 * 1024 + other.smem_reserved
        assert quads.grid == other.sms * min(launch_policy._ctas_per_sm(streamed, other), other.smem_per_sm // per_cta), name
    assert plan_launch(10**6, 21, 21 * 512, 2, GPU_PLANS["T4"], class_stride=512).grid == GPU_PLANS["T4"].sms
    assert plan_launch(10**6, 21, 21 * 512, 2, H100, class_stride=512).grid == launch_policy._max_grid(streamed, H100)
    assert launch_policy._quad_stage_bytes(4) == 0 and launch_policy._quad_stage_bytes(2) == 32 * 1024


# ------------------------------------------------------------------ on the GPU
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_probability_targets(dtype, reduction):
    for rows, cols in SHAPES:
        x, p = logits(rows, cols, dtype), probabilities((rows, cols), dtype)
        w = torch.rand(cols, device="cuda").to(dtype) + 0.5
        check(x, p, reduction=reduction)
        check(x, p, reduction=reduction, weight=w, label_smoothing=0.2, z_loss=1e-3)
    x = logits(1, 4096, dtype)[0]  # unbatched: (C,) and (C,)
    check(x, probabilities((4096,), dtype), reduction=reduction, label_smoothing=0.1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_probability_targets_of_another_dtype_promote_as_pytorch_does(dtype):
    x = logits(300, 1001, dtype)
    for target_dtype in DTYPES.values():
        p = probabilities((300, 1001), target_dtype)
        assert crossent.cross_entropy(x, p).dtype == torch.nn.functional.cross_entropy(x, p).dtype
        for reduction in REDUCTIONS:
            check(x, p, reduction=reduction, label_smoothing=0.1)


@pytest.mark.gpu
def test_probability_targets_in_any_layout():
    """Logits and probabilities each off the 16-byte grid, apart from each other, or not contiguous."""
    for dtype in DTYPES.values():
        for name, x in views(64, 1003, dtype):
            for _, p in views(64, 1003, dtype):
                p.copy_(torch.softmax(p.float(), 1))  # probabilities in the view's own layout
                check(x, p, reduction="none")
                check(x, p.contiguous(), weight=torch.rand(1003, device="cuda").to(dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_positions(dtype, reduction):
    """(N, C, d1, ..., dk) with class indices (a quarter ignored) and with probabilities."""
    for shape in POSITION_SHAPES:
        x = (torch.randn(shape, device="cuda") * 4).to(dtype)
        t, p, w = class_targets(shape, shape[1]), probabilities(shape, dtype), torch.rand(shape[1], device="cuda").to(dtype)
        check(x, t, reduction=reduction)
        check(x, t, reduction=reduction, weight=w, label_smoothing=0.1, ignore_index=-100)
        check(x, t.clamp(min=0), reduction=reduction, z_loss=1e-3, ignore_index=2)
        check(x, p, reduction=reduction)
        check(x, p, reduction=reduction, weight=w, label_smoothing=0.1)


@pytest.mark.gpu
def test_positions_in_any_layout_and_the_kernel_each_takes():
    """Channels last: each position's classes are adjacent, so it is a view of rows and takes the
    other families; a slice is made contiguous; contiguous logits stream with strided classes."""
    x = torch.randn(4, 21, 32, 33, device="cuda")
    t = class_targets(x.shape, 21)
    last = x.to(memory_format=torch.channels_last)
    sliced = torch.randn(4, 21, 32, 40, device="cuda")[..., 3:36]
    for layout in (x, last, sliced):
        for reduction in REDUCTIONS:
            check(layout, t, reduction=reduction)
            check(layout, torch.softmax(layout, 1), reduction=reduction)
    assert launched_kernel(lambda: crossent.cross_entropy(x, t))[0] == "streamed"
    assert launched_kernel(lambda: crossent.cross_entropy(last, t))[0] != "streamed"
    family, args = launched_kernel(lambda: crossent.cross_entropy(x.bfloat16(), torch.softmax(x, 1)))
    assert family == "streamed" and args["E"].endswith("BF16") and args["P"].endswith("F32") and args["kStrided"] == "true"
    lse = crossent.cross_entropy(x, t, return_lse=True)[1]
    torch.testing.assert_close(lse, torch.logsumexp(x, 1))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_class_weights_with_label_smoothing(dtype, reduction):
    for rows, cols in SHAPES + [(16, 256000)]:
        x, t = logits(rows, cols, dtype), targets(rows, cols)
        if rows:
            t[::4] = 3 if cols > 3 else 0
        w = torch.rand(cols, device="cuda").to(dtype) + 0.5
        for eps in (0.1, 1.0):
            check(x, t, reduction=reduction, weight=w, label_smoothing=eps, ignore_index=3)
    for name, x in views(64, 1003, dtype):
        t, w = targets(64, 1003), torch.rand(1003, device="cuda").to(dtype)
        check(x, t, reduction=reduction, weight=w, label_smoothing=0.3)
        w_off = torch.rand(1004, device="cuda").to(dtype)[1:]  # the weights themselves off every grid
        check(x, t, reduction=reduction, weight=w_off, label_smoothing=0.3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_soft_capped_logits(dtype, reduction):
    """softcap with every kind of target and stream, in every layout: the capped logits' loss."""
    for rows, cols in SHAPES:
        x, t, w = logits(rows, cols, dtype), targets(rows, cols), torch.rand(cols, device="cuda").to(dtype) + 0.5
        if rows:
            t[::3] = -100
        for cap in (30.0, 2.0):  # logits within the cap's near-linear stretch, and most of them saturated
            check(x, t, reduction=reduction, softcap=cap)
        check(x, t, reduction=reduction, softcap=10.0, weight=w, label_smoothing=0.1, z_loss=1e-3)
        check(x, probabilities((rows, cols), dtype), reduction=reduction, softcap=10.0)
    for shape in POSITION_SHAPES[:4]:  # strided classes, quads of positions and lone ones
        x = (torch.randn(shape, device="cuda") * 4).to(dtype)
        check(x, class_targets(shape, shape[1]), reduction=reduction, softcap=3.0, label_smoothing=0.1)
        check(x, probabilities(shape, dtype), reduction=reduction, softcap=3.0)
    for name, x in views(64, 1003, dtype):
        check(x, targets(64, 1003), reduction=reduction, softcap=3.0)


@pytest.mark.gpu
def test_soft_capped_logits_special_values_lse_and_kernel():
    """-inf caps to -softcap and +inf to softcap (both finite), NaN stays NaN; the lse returned is
    the capped logits'; a SoftCapped instance runs."""
    x = torch.randn(8, 300, device="cuda") * 8
    x[1, :] = float("-inf")
    x[2, 10:20] = float("-inf")
    x[3, 7] = float("inf")
    x[4, 9] = float("nan")
    x[6, 100] = 1e30
    t = torch.arange(8, device="cuda") * 11
    for reduction in REDUCTIONS:
        check(x, t, reduction=reduction, softcap=15.0)
        check(x.reshape(8, 30, 10), t.reshape(8, 1).expand(8, 10).remainder(30).contiguous(), reduction=reduction,
              softcap=15.0)
    lse = crossent.cross_entropy(x, t, softcap=15.0, return_lse=True)[1]
    torch.testing.assert_close(lse.double(), torch.logsumexp(15.0 * torch.tanh(x.double() / 15.0), 1), rtol=1e-6,
                               atol=1e-6, equal_nan=True)
    family, args = launched_kernel(lambda: crossent.cross_entropy(x.half(), t, softcap=15.0))
    assert family == "streamed" and "SoftCapped<" in args["E"] and args["E"].endswith("F16>"), args


@pytest.mark.gpu
def test_special_values():
    """-inf, +inf, NaN and huge logits in the streams, as PyTorch gives them (NaN where a probability
    of 0 meets -inf: 0 * inf)."""
    x = torch.randn(8, 300, device="cuda")
    x[1, :] = float("-inf")
    x[2, 10:20] = float("-inf")
    x[3, 7] = float("inf")
    x[4, 9] = float("nan")
    x[5] = x[5] * 1e3
    x[6, 100] = 1e30
    p = probabilities((8, 300), torch.float32)
    t = torch.arange(8, device="cuda") * 11
    for reduction in REDUCTIONS:
        check(x, p, reduction=reduction)
        check(x, t, reduction=reduction, weight=torch.rand(300, device="cuda"), label_smoothing=0.1)
        xs = x.reshape(8, 30, 10)
        check(xs, p.reshape(8, 30, 10), reduction=reduction)
        check(xs, t.reshape(8, 1).expand(8, 10).remainder(30).contiguous(), reduction=reduction, label_smoothing=0.1)


@pytest.mark.gpu
def test_streamed_results_are_bitwise_the_same_run_to_run():
    x, p = logits(3000, 4099, torch.float32), probabilities((3000, 4099), torch.float32)
    x4 = torch.randn(8, 19, 64, 64, device="cuda")
    t4, w = class_targets(x4.shape, 19), torch.rand(19, device="cuda")
    calls = [lambda: crossent.cross_entropy(x, p, label_smoothing=0.1),
             lambda: crossent.cross_entropy(x4, t4, weight=w),
             lambda: crossent.cross_entropy(x4, torch.softmax(x4, 1), reduction="sum")]
    for call in calls:
        first = call()
        for _ in range(5):
            assert torch.equal(call(), first)


@pytest.mark.gpu
def test_what_pytorch_rejects_raises_clearly():
    x, p = logits(8, 10, torch.float32), probabilities((8, 10), torch.float32)
    cases = [
        ((x, p[:, :5]), {}, RuntimeError, "must have the logits' shape"),
        ((x, p), {"ignore_index": 0}, RuntimeError, "ignore_index is not supported"),
        ((x, p.double()), {}, RuntimeError, "the kernels take float32, bfloat16 or float16 class-probability"),
        ((x.reshape(2, 4, 10), torch.zeros(2, 4, dtype=torch.long, device="cuda")), {}, RuntimeError, r"shape \(2, 10\)"),
        ((x.reshape(2, 4, 10), torch.zeros(3, 10, dtype=torch.long, device="cuda")), {}, ValueError, "batch sizes differ"),
        ((x[0, 0], torch.zeros((), dtype=torch.long, device="cuda")), {}, RuntimeError, "0-dim"),
    ]
    for args, kwargs, exc, msg in cases:  # ModelNew's own checks (cross_entropy hands float64 to PyTorch)
        with pytest.raises(exc, match=msg):
            crossent.ModelNew(**kwargs)(*args)
    check(x, p)  # the CUDA context is still healthy
