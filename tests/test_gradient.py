"""Training: the gradient of every option through autograd, against float64's own autograd of the
reference; no gradient work without one; double backward refused; torch.compile with fullgraph,
CUDA graphs, determinism and a training run beside eager PyTorch's. On the CPU, the gradient's
launch policy and its fields in the parameter block."""
import re

import pytest
import torch

import crossent
from crossent import build, constants, dispatch, gradient, ops
from crossent import policy as launch_policy

from cases import DTYPES, logits, views
from cases import expected_loss as expected
from conftest import read
from plans import GPU_PLANS, H100
from test_options import assert_close
from test_streamed import probabilities
from test_streamed import class_targets as streamed_targets

# float32 gradients: within 1e-6 of float64's, relative to its largest element. 16-bit ones are
# float32's rounded once: half a unit in their last place more.
GRAD_RTOL = {torch.float32: 0.0, torch.bfloat16: 2**-8, torch.float16: 2**-11}

# Each option alone and together, on rows whose width is off every vector grid.
OPTIONS = {
    "defaults": {},
    "sum": {"reduction": "sum"},
    "none": {"reduction": "none"},
    "ignore_index": {"ignore_index": 3},
    "weight": {"weight": True},
    "label smoothing": {"label_smoothing": 0.1},
    "weight, label smoothing": {"weight": True, "label_smoothing": 0.2},
    "z_loss": {"z_loss": 1e-2},
    "softcap": {"softcap": 5.0},
    "everything, none": {"weight": True, "label_smoothing": 0.1, "z_loss": 1e-3, "softcap": 8.0, "ignore_index": 3,
                         "reduction": "none"},
    "everything, sum": {"weight": True, "label_smoothing": 0.3, "z_loss": 1e-3, "softcap": 8.0, "reduction": "sum"},
}
PROBS_OPTIONS = {k: v for k, v in OPTIONS.items() if "ignore_index" not in v}
# Rows of vectors and edges, a warp a row and fewer lanes, one class, one row, none; the fused
# family takes those, rows longer than a CTA's registers hold take a cluster's (from sm_90 on: 2 to 16
# CTAs), and rows longer still, or soft-capped ones past a CTA, go to the gradient family.
SHAPES = [(64, 1000), (33, 4099), (300, 7), (5, 1), (1, 4096), (0, 9), (3, 16411), (3, 70001)]
# (N, C, d1, ..., dk): strided classes, odd positions, one class.
POSITION_SHAPES = [(2, 5, 3, 4), (3, 21, 17), (4, 1, 5)]


def class_targets(shape, cols, ignore_index=-100, ignored=0.2):
    """Class indices, a fifth of them (`ignored`) the options' ignore index: none out of range."""
    return streamed_targets(shape, cols, ignored, ignore_index=ignore_index)


def reference_options(options, cols, dtype):
    """The options as cross_entropy takes them, with random class weights where asked."""
    options = dict(options)
    if options.get("weight"):
        options["weight"] = (torch.rand(cols, device="cuda") + 0.5).to(dtype)
    return options


def incoming(loss, scale):
    """The loss's incoming gradient: `scale` for a scalar loss, random per row for reduction none."""
    if loss.dim() == 0 and loss.numel() == 1 and scale is not None:
        return torch.full_like(loss, scale)
    return torch.randn_like(loss)


def float64_loss(x64, t64, options):
    """The float64 reference's loss for float64 logits and probabilities (or class indices)."""
    weight = options.get("weight")
    return expected(x64, t64, options.get("ignore_index", -100), options.get("reduction", "mean"),
                    None if weight is None else weight.double(), options.get("z_loss", 0.0),
                    options.get("label_smoothing", 0.0), options.get("softcap"))


def float64_gradients(x, t, grad, options, lse_grad=None):
    """d loss / d x (and d loss / d t for probabilities) of the float64 reference, by autograd."""
    x64 = x.detach().double().requires_grad_()
    t64 = t.detach().double().requires_grad_() if t.is_floating_point() else t
    loss = float64_loss(x64, t64, options)
    total = (loss * grad.double()).sum()
    if lse_grad is not None:
        cap = options.get("softcap")
        y = cap * torch.tanh(x64 / cap) if cap else x64
        lse = torch.logsumexp(y, 1 if x.dim() > 1 else 0)
        total = total + (lse * lse_grad.double()).sum()
    inputs = [x64, t64] if t.is_floating_point() else [x64]
    return torch.autograd.grad(total, inputs) if total.requires_grad else [torch.zeros_like(i) for i in inputs]


def assert_gradient(got, want, dtype, case=None, roundings=1, lse=0.0):
    """got within 1e-6 of want relative to its largest element, and for 16-bit `got` its dtype's
    rounding, that many times. lse: the rows' largest |log-sum-exp|, whose float32 rounding (an ulp of
    it, absolute) each softmax term exp(x - lse) carries relative to itself: 2^-23 lse of the largest
    element more (1.9e-6 at lse = 16, C = 1000 classes of logits of 4 units)."""
    assert got.shape == want.shape and got.dtype == dtype, (got.shape, want.shape, got.dtype, dtype)
    got = got.double()
    assert torch.equal(torch.isnan(got), torch.isnan(want)), (got, want)
    keep = ~torch.isnan(want)
    if not keep.any():
        return
    err = (got - want)[keep].abs()
    bound = (1e-6 + 2**-23 * lse) * want[keep].abs().max() + roundings * (GRAD_RTOL[dtype] * want[keep].abs() + 2**-25)
    worst = (err / bound).argmax()
    assert (err <= bound).all(), (case, err[worst].item(), want[keep][worst].item(), want[keep].abs().max().item())


def check_gradient(x, t, options, scale=1.0, lse_grad=False):
    """cross_entropy's loss and its gradients through autograd against float64's, for logits x and
    targets t."""
    x = x.detach().requires_grad_()
    probs = t.is_floating_point()
    t = t.detach().requires_grad_() if probs else t
    out = crossent.cross_entropy(x, t, **options, return_lse=lse_grad)
    loss, lse = out if lse_grad else (out, None)
    want_loss = float64_loss(x.detach().double(), t.detach().double() if probs else t, options)
    assert_close(loss.detach(), want_loss, loss.dtype)
    grad = incoming(loss, scale)
    lse_incoming = torch.randn_like(lse) if lse_grad else None
    if lse_grad:
        torch.autograd.backward([loss, lse], [grad, lse_incoming])
    else:
        loss.backward(grad)
    want = float64_gradients(x, t, grad, options, lse_incoming)
    case = (tuple(x.shape), x.stride(), {k: v for k, v in options.items() if k != "weight"}, "weight" in options)
    lse = x.detach().double().logsumexp(1 if x.dim() > 1 else 0)
    lse = lse[lse.isfinite()]  # rows of -inf, inf or NaN logits have NaN gradients, which it skips
    lse_max = lse.abs().max().item() if lse.numel() else 0.0
    assert_gradient(x.grad, want[0], x.dtype, case, lse=lse_max)
    if probs:
        assert_gradient(t.grad, want[1], t.dtype, case, lse=lse_max)


# ------------------------------------------------------------------ on the CPU
def test_a_second_load_registers_operators_of_its_own():
    """A harness that runs model_new.py's source (the bundle) in a process where the package is loaded
    (run_eval, KernelBench) gets operators under a namespace of its own; the first load's stay as they
    were."""
    context = {}
    exec(compile(read("model_new.py"), "model_new.py", "exec"), context)
    assert context["OP_NAMESPACE"] != ops.OP_NAMESPACE
    for namespace in (ops.OP_NAMESPACE, context["OP_NAMESPACE"]):
        assert hasattr(getattr(torch.ops, namespace), "cross_entropy_backward"), namespace
    assert ops.forward_op._qualname == f"{ops.OP_NAMESPACE}::cross_entropy"


@pytest.mark.parametrize("gpu", ["H100", "T4", "B200"])
def test_the_gradient_policy(gpu):
    """A warp a row at most, fewer lanes where each would get less than a round of vectors; a thread a
    position for strided classes; every CTA that fits, or as many as the rows need."""
    on = GPU_PLANS[gpu]
    ctas = launch_policy._max_grid(constants.GRADIENT, on)
    for rows, cols, elem_bytes, class_stride, group in [(32768, 4096, 4, 1, 32), (8192, 128256, 2, 1, 32),
                                                       (300, 7, 4, 1, 1), (1000, 64, 4, 1, 4), (1000, 64, 2, 1, 2),
                                                       (5, 1, 2, 1, 1), (2 * 512 * 512, 21, 2, 512 * 512, 1)]:
        plan = launch_policy.gradient_plan(rows, cols, elem_bytes, on, class_stride)
        assert plan.family == constants.GRADIENT and plan.group == group, (rows, cols, plan)
        assert plan.grid == min(ctas, -(-rows // (constants.THREADS // group))), plan
    assert launch_policy.gradient_plan(0, 5, 4, H100, 1).grid == 1


@pytest.mark.parametrize("gpu", ["H100", "T4", "B200"])
def test_the_fused_policy(gpu):
    """Where the logits train, contiguous rows of class indices on the 16-byte grid that fit a CTA's
    registers take the fused family: the fewest lanes that hold a row at FUSED_VECS vectors each (half
    as many on sm_75: the T4), and a lane at least for each element off the vectors (16 for 16-bit
    logits, 8 for float32), several rows a warp where they are short. From sm_90 on, longer rows take
    a cluster's CTAs, a row a chunk, up to 16 CTAs on sm_90 and 8 after it, none for soft-capped
    logits; every other problem the forward's own plan."""
    on = GPU_PLANS[gpu]
    ctas = launch_policy._max_grid(constants.FUSED, on)
    # (rows, cols, element bytes, group on sm_90, on sm_100, on sm_75); 0: not fused
    for rows, cols, elem_bytes, *groups in [
            (32768, 4096, 4, 128, 128, 256), (32768, 4096, 2, 64, 64, 128), (65536, 1000, 2, 16, 16, 32),
            (300, 7, 4, 8, 8, 8), (300, 7, 2, 16, 16, 16), (1, 8192, 4, 256, 256, 0),
            (4096, 16384, 2, 256, 256, 0),
            (4096, 8192, 2, 128, 128, 256), (3, 8193, 4, 512, 512, 0), (16384, 32000, 2, 512, 512, 0),
            (8192, 128256, 2, 2048, 2048, 0), (4096, 256000, 2, 4096, 0, 0), (2, 600000, 2, 0, 0, 0)]:
        group = groups[["H100", "B200", "T4"].index(gpu)]
        plan = launch_policy.plan_launch(rows, cols, cols, elem_bytes, on, fuse=True)
        if not group:
            assert plan.family != constants.FUSED
            assert plan == launch_policy.plan_launch(rows, cols, cols, elem_bytes, on)
            continue
        assert plan.family == constants.FUSED and plan.group == group, (rows, cols, plan)
        cluster = max(1, group // constants.THREADS)
        assert plan.chunks == -(-rows // max(1, constants.THREADS // group)), plan
        assert plan.grid == min(ctas // cluster, plan.chunks) * cluster, plan
        capped = launch_policy.plan_launch(rows, cols, cols, elem_bytes, on, capped=True, fuse=True)
        assert (capped.family == constants.FUSED) == (cluster == 1), capped
    if on.cc >= 90:  # a cluster's CTAs hold a share of the row in shared memory too: an SM of less holds fewer
        small = on._replace(smem_per_sm=48 << 10)  # one CTA with its share
        plan = launch_policy.plan_launch(8192, 128256, 128256, 2, small, fuse=True)
        every = launch_policy.plan_launch(8192, 128256, 128256, 2, on, fuse=True)
        assert plan.grid == small.sms // 8 * 8 < every.grid, plan
    for args, options in [((64, 1000, 1000, 4), {"probs": True}), ((64, 1000, 1000, 4), {"class_stride": 7}),
                          ((64, 1000, 1000, 4), {"offset": 4}), ((64, 1000, 1003, 4), {})]:
        assert launch_policy.plan_launch(*args, on, fuse=True, **options).family != constants.FUSED, (args, options)


def test_the_gradients_layout_is_the_one_the_kernel_reads_as_rows():
    """empty_gradient (the real backward's and its fake's): channels last where the logits are, which
    the kernel writes as rows of C in place; else contiguous, whatever the logits' strides."""
    x = torch.randn(2, 5, 3, 4)
    last = x.contiguous(memory_format=torch.channels_last)
    for given, channels_last in [(x, False), (last, True), (torch.randn(7, 3).t(), False), (torch.randn(6), False),
                                 (torch.randn(2, 5, 3, 4)[:, :, 1:], False)]:
        g = dispatch.empty_gradient(given, torch.bfloat16)
        assert g.shape == given.shape and g.dtype == torch.bfloat16
        assert g.movedim(1, -1).is_contiguous() if channels_last else g.is_contiguous(), given.stride()


def test_the_means_divisor_counts_as_the_kernels_do():
    """Rows counted (or their classes' weights), int32 targets compared with the ignore index in 64
    bits: 2**32 + 3 is no class of an int32 tensor."""
    t = torch.tensor([0, 3, -100, 3, 1], dtype=torch.int32)
    assert gradient.mean_divisor(t, None, -100).item() == 4
    assert gradient.mean_divisor(t, None, 2**32 + 3).item() == 5
    assert gradient.mean_divisor(t.long(), None, 3).item() == 3
    w = torch.tensor([0.5, 2.0, 1.0, 4.0])
    assert gradient.mean_divisor(t, w, -100).item() == 0.5 + 4.0 + 4.0 + 2.0


def test_what_is_not_a_tensor_meets_the_apis_error():
    """The dispatch asks whether a gradient is wanted before the checks run: a list for targets must
    still get the checks' TypeError (cross_entropy: PyTorch's, which takes what is not on a GPU)."""
    with pytest.raises(TypeError, match="must be Tensor, not list"):
        crossent.cross_entropy(torch.randn(2, 3, requires_grad=True), [1, 2])
    with pytest.raises(TypeError, match="two tensors"):
        crossent.ModelNew()(torch.randn(2, 3, requires_grad=True), [1, 2])
    with pytest.raises(TypeError, match="two tensors"):
        crossent.ModelNew()([[0.5, 0.5]], torch.tensor([0]))


def test_the_operators_are_registered_with_their_autograd():
    assert re.fullmatch(r"crossent(_\d+)?", ops.OP_NAMESPACE), ops.OP_NAMESPACE
    namespace = getattr(torch.ops, ops.OP_NAMESPACE)
    assert hasattr(namespace, "cross_entropy") and hasattr(namespace, "cross_entropy_backward")
    schema = str(namespace.cross_entropy.default._schema)
    assert "Tensor? weight" in schema and schema.endswith("-> (Tensor, Tensor)"), schema


# ------------------------------------------------------------------ on the GPU
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("name", OPTIONS)
def test_class_index_gradients(dtype, name):
    """An incoming 1 keeps the gradient a fused forward wrote; 0.7 has the backward write it anew."""
    for rows, cols in SHAPES:
        options = reference_options(OPTIONS[name], cols, dtype)
        t = class_targets((rows, cols), cols, options.get("ignore_index", -100))
        for scale in (1.0, 0.7):
            check_gradient(logits(rows, cols, dtype), t, options, scale=scale)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("name", PROBS_OPTIONS)
def test_probability_target_gradients(dtype, name):
    for rows, cols in SHAPES:
        options = reference_options(PROBS_OPTIONS[name], cols, dtype)
        check_gradient(logits(rows, cols, dtype), probabilities((rows, cols), dtype), options)
    x = logits(40, 300, dtype)  # probabilities of another dtype: float32's, as PyTorch promotes them
    check_gradient(x, probabilities((40, 300), torch.float32 if dtype != torch.float32 else torch.bfloat16), {})


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_positions_unbatched_and_views(dtype):
    for shape in POSITION_SHAPES:
        for name in ("defaults", "everything, none", "everything, sum"):
            options = reference_options(OPTIONS[name], shape[1], dtype)
            x = (torch.randn(shape, device="cuda") * 4).to(dtype)
            t = class_targets(shape, shape[1], options.get("ignore_index", -100))
            check_gradient(x, t, options)
            check_gradient(x.movedim(1, -1).contiguous().movedim(-1, 1), t, options)  # channels last
            if "ignore_index" not in options:
                check_gradient(x, probabilities(shape, dtype), options)
    for name in ("defaults", "everything, none"):
        options = reference_options(OPTIONS[name], 37, dtype)
        ignore_index = options.get("ignore_index", -100)
        check_gradient(logits(1, 37, dtype)[0], class_targets((1, 37), 37, ignore_index, 0.0)[0], options)
        for _, view in views(50, 37, dtype):
            check_gradient(view, class_targets((50, 37), 37, ignore_index), options)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["defaults", "softcap", "everything, none"])
def test_the_log_sum_exps_gradient(name):
    """Where the returned log-sum-exp reaches the result (a z-loss of one's own, say) its gradient adds."""
    options = reference_options(OPTIONS[name], 1000, torch.float32)
    t = class_targets((64, 1000), 1000, options.get("ignore_index", -100))
    check_gradient(logits(64, 1000, torch.float32), t, options, lse_grad=True)
    check_gradient(logits(64, 1000, torch.float32), probabilities((64, 1000), torch.float32),
                   {k: v for k, v in options.items() if k != "ignore_index"}, lse_grad=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_the_fused_forward_writes_the_gradient_and_the_backward_keeps_it(dtype):
    """One launch for loss and gradient where the fused family takes the logits, none where they do
    not train; the backward leaves rows whose incoming gradient is 1 as the forward wrote them and
    writes the rest anew (reduction none: rows of both kinds), and a second backward through a
    retained graph gives the same gradient again."""
    x, t = logits(256, 1000, dtype).requires_grad_(), class_targets((256, 1000), 1000)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        loss = crossent.cross_entropy(x, t, label_smoothing=0.1)
        torch.cuda.synchronize()
    assert [e.name for e in prof.events() if "cross_entropy" in e.name and "fused" in e.name], prof.events()
    loss.backward(retain_graph=True)
    first = x.grad.clone()
    loss.backward()
    assert torch.equal(x.grad, 2 * first)
    assert_gradient(first, float64_gradients(x, t, torch.ones((), device="cuda"), {"label_smoothing": 0.1})[0], dtype)
    options = {"reduction": "none", "z_loss": 1e-3, "weight": (torch.rand(1000, device="cuda") + 0.5).to(dtype)}
    x.grad = None
    losses = crossent.cross_entropy(x, t, **options)
    grad = torch.where(torch.arange(256, device="cuda") % 3 == 0, torch.ones(256, device="cuda"),
                       torch.randn(256, device="cuda")).to(dtype)
    losses.backward(grad)
    assert_gradient(x.grad, float64_gradients(x, t, grad, options)[0], dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_the_fused_steps_backward_is_one_launch(dtype):
    """After the fused forward, the backward launches the gradient kernel and nothing else: the kernel
    reads the incoming gradient in its dtype, and the mean's 1 / divisor, itself."""
    x, t = logits(256, 1000, dtype).requires_grad_(), class_targets((256, 1000), 1000)
    for options in ({}, {"reduction": "sum"}, {"reduction": "none"}):
        x.grad = None
        loss = crossent.cross_entropy(x, t, **options)
        grad = (torch.rand(loss.shape, device="cuda") + 0.5).to(loss.dtype)  # not 1: every row written anew
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            loss.backward(grad)
            torch.cuda.synchronize()
        kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        assert len(kernels) == 1 and "cross_entropy_gradient_kernel" in kernels[0], (options, kernels)
        assert_gradient(x.grad, float64_gradients(x, t, grad, options)[0], dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_clusters_take_row_after_row(dtype):
    """Rows held by a thread-block cluster (sm_90 on), many to a cluster: the claims it sends between
    its CTAs, both parities of their shared slots and the arrival barriers' phases, at 2 to 16 CTAs a
    row; the cluster's instance is the one launched."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("clusters hold rows from sm_90 on; this GPU takes them in two kernels")
    for rows, cols in [(1000, 16411), (300, 70001)]:
        x = logits(rows, cols, dtype)
        plan = launch_policy._fused_plan(rows, cols, x.element_size(), build.device_gpu(x.get_device()))
        if plan is None and cols > 16411:  # past 8 CTAs: sm_90's alone
            continue
        ctas = plan.group // constants.THREADS
        assert ctas > 1 and plan.chunks >= 3 * plan.grid // ctas, plan  # past each cluster's first two rows
        t = class_targets((rows, cols), cols)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            crossent.cross_entropy(x.detach().requires_grad_(), t)
            torch.cuda.synchronize()
        assert [e.name for e in prof.events() if re.search(r"cross_entropy_fused_kernel<.*, true>", e.name)], \
            [e.name for e in prof.events()]
        for name in ("defaults", "ignore_index", "weight, label smoothing", "z_loss"):
            options = reference_options(OPTIONS[name], cols, dtype)
            check_gradient(x, class_targets((rows, cols), cols, options.get("ignore_index", -100)), options)
        check_gradient(x, t, {"reduction": "none"})


def inplace_gradient(x, t, options, grad=None):
    """(d loss / d x, whether it came back in x's own storage, the most bytes the step allocated past
    its start) where cross_entropy writes it over a non-leaf copy of x; grad: the loss's incoming
    gradient (None: 1)."""
    y = x.detach().clone().requires_grad_() * 1  # a non-leaf; its backward saves nothing of it
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    loss = crossent.cross_entropy(y, t, **options, inplace=True)
    (dx,) = torch.autograd.grad(loss, y, torch.ones_like(loss) if grad is None else grad)
    torch.cuda.synchronize()
    return dx, dx.data_ptr() == y.data_ptr(), torch.cuda.max_memory_allocated() - start


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_inplace_writes_the_gradient_over_the_logits(dtype):
    """inplace=True, for every way the gradient gets written (a CTA's fused rows, a cluster's, the
    soft-capped ones, rows past the fused family, strided classes, channels last, one row,
    probabilities): the out-of-place loss's gradient, in the logits' own storage, bit for bit at an
    incoming 1; at others (reduction none: one a row, some of them 1) that gradient times it, rounded
    once more; and the step allocates nothing near the logits' size."""
    cases = [((64, 1000), {}), ((1000, 16411), {"weight": True, "label_smoothing": 0.1}),
             ((64, 1000), {"softcap": 5.0, "z_loss": 1e-3}), ((3, 300000), {}), ((3, 16411), {"softcap": 5.0}),
             ((2, 5, 3, 4), OPTIONS["everything, sum"]), ((300,), {}), ((64, 1000), {"probs": True})]
    for shape, options in cases:
        cols = shape[1] if len(shape) > 1 else shape[0]
        options = reference_options(options, cols, dtype)
        probs = options.pop("probs", False)
        x = (torch.randn(shape, device="cuda") * 4).to(dtype)
        views = [x, x.movedim(1, -1).contiguous().movedim(-1, 1)] if len(shape) > 2 else [x]
        t = probabilities(shape, dtype) if probs else class_targets((1,) + shape if len(shape) == 1 else shape, cols)
        t = t[0] if len(shape) == 1 and not probs else t
        for view in views:
            for reduction in ("mean", "none"):
                options["reduction"] = reduction
                xr = view.detach().clone().requires_grad_()
                loss = crossent.cross_entropy(xr, t, **options)
                loss.backward(torch.ones_like(loss))
                dx, in_place, extra = inplace_gradient(view, t, options)
                case = (shape, reduction, {k: v for k, v in options.items() if k != "weight"})
                assert in_place and torch.equal(dx, xr.grad), case
                assert extra < view.numel() * view.element_size() // 8 + (1 << 20), (case, extra)
                grad = torch.full_like(loss, 0.7) if reduction == "mean" else torch.where(
                    torch.rand(loss.shape, device="cuda") < 0.3, 1.0, torch.randn(loss.shape, device="cuda")).to(loss.dtype)
                dx, in_place, _ = inplace_gradient(view, t, options, grad)
                want = float64_gradients(view, t, grad, options)[0]
                assert in_place, case
                assert_gradient(dx, want, dtype, case, roundings=2)


@pytest.mark.gpu
def test_inplace_refuses_what_it_would_get_wrong():
    """Autograd raises where a tensor saved from the logits would be read (it holds the gradient now);
    leaves, probability targets that train, a gradient through the returned log-sum-exp, a layout the
    kernels copy, rows that overlap in memory and a second backward are refused (rows further apart
    than C, or of one class, are not); without a gradient the logits stay as they were."""
    w = logits(64, 1000, torch.float32).requires_grad_()
    t = class_targets((64, 1000), 1000)
    y = w * 2
    aux = y.pow(2).sum()  # pow saves y
    loss = crossent.cross_entropy(y, t, inplace=True) + aux
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    for leaf in (w, w[:10]):
        with pytest.raises(RuntimeError, match="leaf"):
            crossent.cross_entropy(leaf, t[:leaf.shape[0]], inplace=True)
    with pytest.raises(RuntimeError, match="probability targets"):
        crossent.cross_entropy(w * 2, probabilities((64, 1000), torch.float32).requires_grad_(), inplace=True)
    loss, lse = crossent.cross_entropy(w * 2, t, inplace=True, return_lse=True)
    with pytest.raises(RuntimeError, match="log-sum-exp"):
        (loss + lse.sum()).backward()
    with pytest.raises(RuntimeError, match="copied"):
        crossent.cross_entropy((logits(1000, 64, torch.float32).requires_grad_() * 2).t(), t, inplace=True)
    y = w * 2
    for overlapping in (y[0].expand(64, 1000), y.view(-1)[:63 * 500 + 1000].as_strided((64, 1000), (500, 1))):
        with pytest.raises(RuntimeError, match="overlap"):
            crossent.cross_entropy(overlapping, t, inplace=True)
    assert torch.equal(y, w.detach() * 2)  # refused before any launch
    # not refused: rows further apart than C, and rows of one class; the logits hold their gradient after
    for cols, legal in ((999, lambda y: y[:, :999]), (1, lambda y: y[:, :1].contiguous())):
        tl = t.clamp(max=cols - 1)
        grads = []
        for inplace in (False, True):
            w.grad = None
            y = legal(w * 2)
            crossent.cross_entropy(y, tl, inplace=inplace).backward()
            grads.append(w.grad)
        assert torch.equal(grads[0], grads[1]) and torch.equal(y * 2, grads[1][:, :cols]), cols
    loss = crossent.cross_entropy(w * 2, t, inplace=True)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()
    y = w.detach() * 2
    kept = y.clone()
    with torch.no_grad():
        crossent.cross_entropy(y.requires_grad_(), t, inplace=True)
    assert torch.equal(y, kept)


@pytest.mark.gpu
def test_special_values():
    x = logits(8, 100, torch.float32)
    t = torch.arange(8, device="cuda")
    x[1, :] = float("-inf")   # all -inf: NaN
    x[2, 2] = float("-inf")   # -inf at the target: its gradient is finite
    x[3, 10:20] = float("-inf")
    x[4, 7] = float("nan")
    check_gradient(x, t, {"reduction": "sum"})
    x = logits(4, 100, torch.float32)
    x[1, :] = float("nan")    # an ignored row's gradient is exactly 0, whatever it holds
    x.requires_grad_()
    crossent.cross_entropy(x, torch.tensor([1, -100, 3, 4], device="cuda")).backward()
    assert torch.equal(x.grad[1], torch.zeros_like(x.grad[1])) and torch.isfinite(x.grad).all()


@pytest.mark.gpu
def test_every_row_ignored_gives_a_zero_gradient():
    x = logits(6, 50, torch.float32).requires_grad_()
    loss = crossent.cross_entropy(x, torch.full((6,), -100, device="cuda"))
    loss.backward()
    assert torch.isnan(loss) and torch.equal(x.grad, torch.zeros_like(x))


@pytest.mark.gpu
def test_modelnew_trains_and_no_grad_does_no_gradient_work():
    x, t = logits(64, 1000, torch.float32), class_targets((64, 1000), 1000)
    model = crossent.ModelNew(label_smoothing=0.1)
    assert model(x, t).grad_fn is None
    x.requires_grad_()
    with torch.no_grad():
        assert model(x, t).grad_fn is None
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        with torch.no_grad():
            model(x, t)
        torch.cuda.synchronize()
    assert not any("gradient" in e.name for e in prof.events())
    loss = model(x, t)
    assert loss.grad_fn is not None
    loss.backward()
    want = float64_gradients(x, t, torch.ones((), device="cuda"), {"label_smoothing": 0.1})[0]
    assert_gradient(x.grad, want, torch.float32)


@pytest.mark.gpu
def test_double_backward_raises():
    x = logits(16, 100, torch.float32).requires_grad_()
    loss = crossent.cross_entropy(x, class_targets((16, 100), 100))
    (g,) = torch.autograd.grad(loss, x, create_graph=False)
    assert g.grad_fn is None
    loss = crossent.cross_entropy(x, class_targets((16, 100), 100))
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(loss, x, create_graph=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_gradients_are_bitwise_the_same_run_to_run(dtype):
    x, t = logits(4096, 4099, dtype), class_targets((4096, 4099), 4099)
    w = torch.rand(4099, device="cuda").to(dtype)
    grads = []
    for _ in range(3):
        xr = x.clone().requires_grad_()
        crossent.cross_entropy(xr, t, weight=w, label_smoothing=0.1).backward()
        grads.append(xr.grad)
    assert torch.equal(grads[0], grads[1]) and torch.equal(grads[0], grads[2])


@pytest.mark.gpu
def test_the_operators_pass_torch_librarys_checks():
    """The schema, the fake (shapes, dtypes), the autograd registration, and traced against eager."""
    x, w = logits(16, 100, torch.float32).requires_grad_(), torch.rand(100, device="cuda")
    q = probabilities((16, 100), torch.float32).requires_grad_()
    xb = logits(16, 100, torch.bfloat16).requires_grad_()
    for args in [(x, class_targets((16, 100), 100), None, -100, "mean", 0.0, 0.0, 0.0, False, False),
                 (x, class_targets((16, 100), 100, 3), w, 3, "none", 0.1, 1e-3, 5.0, False, False),
                 (x, q, w, -100, "sum", 0.1, 0.0, 0.0, False, False),
                 (xb, class_targets((16, 100), 100), None, -100, "none", 0.0, 0.0, 0.0, True, False)]:
        torch.library.opcheck(ops.forward_op, args)


@pytest.mark.gpu
def test_a_compiled_model_keeps_it_in_one_graph():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 1000, device="cuda")
    x, t = torch.randn(128, 64, device="cuda"), class_targets((128, 1000), 1000)

    def step(x, t):
        return crossent.cross_entropy(linear(x), t, label_smoothing=0.1, z_loss=1e-3)
    compiled = torch.compile(step, fullgraph=True)
    loss = compiled(x, t)
    loss.backward()
    got = [p.grad.clone() for p in linear.parameters()]
    linear.zero_grad()
    want_loss = step(x, t)
    want_loss.backward()
    torch.testing.assert_close(loss, want_loss, rtol=1e-6, atol=0)
    for g, p in zip(got, linear.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["transposed", "channels last", "strided classes", "probabilities unlike logits"])
def test_a_compiled_step_takes_every_layout(layout):
    """Inductor holds each output of the backward's operator to the strides its fake declares."""
    if layout == "transposed":
        x, t = logits(300, 64, torch.float32).t(), class_targets((64, 300), 300)
    else:
        x = torch.randn(2, 5, 3, 4, device="cuda")
        if layout != "strided classes":
            x = x.contiguous(memory_format=torch.channels_last)
        t = probabilities((2, 5, 3, 4), torch.float32) if layout.startswith("prob") else class_targets(x.shape, 5)
    compiled = torch.compile(lambda x, t: crossent.cross_entropy(x, t, label_smoothing=0.1), fullgraph=True)
    grads = []
    for fn in (compiled, crossent.cross_entropy):
        xr, tr = x.detach().requires_grad_(), t.detach().requires_grad_() if t.is_floating_point() else t
        (fn(xr, tr) if fn is compiled else fn(xr, tr, label_smoothing=0.1)).backward()
        grads.append((xr.grad, tr.grad if t.is_floating_point() else None))
    (gx, gt), (wx, wt) = grads
    # Eager calls may take the fused family, whose sums of exp round apart from the other families'.
    assert gx.stride() == wx.stride()
    torch.testing.assert_close(gx, wx, rtol=1e-6, atol=1e-9)
    assert gt is None or torch.equal(gt, wt)


@pytest.mark.gpu
def test_a_training_step_replays_in_a_cuda_graph():
    x, t = logits(256, 1000, torch.float32).requires_grad_(), class_targets((256, 1000), 1000)
    model = crossent.ModelNew(weight=torch.rand(1000, device="cuda"), label_smoothing=0.1)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up off the default stream, as capture needs
        for _ in range(2):
            x.grad = None
            model(x, t).backward()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    x.grad = None
    with torch.cuda.graph(graph):
        loss = model(x, t)
        loss.backward()
    for _ in range(2):
        x.data.copy_(logits(256, 1000, torch.float32))
        t.copy_(class_targets((256, 1000), 1000))
        graph.replay()
        torch.cuda.synchronize()
        xr = x.detach().clone().requires_grad_()
        want = model(xr, t)
        want.backward()
        assert torch.equal(loss, want) and torch.equal(x.grad, xr.grad)


@pytest.mark.gpu
@pytest.mark.parametrize("inplace", [False, True], ids=["", "inplace"])
def test_a_training_run_follows_eagers_loss_curve(inplace):
    """50 AdamW steps of an embedding and a linear layer under this loss and under PyTorch's, in
    float32, from the same weights: the losses agree within 1e-4, relative, at every step."""
    vocab, dim, rows = 1000, 64, 512
    curves = []
    ours = lambda x, t, **options: crossent.cross_entropy(x, t, **options, inplace=inplace)  # noqa: E731
    for loss_fn in (ours, torch.nn.functional.cross_entropy):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Embedding(vocab, dim), torch.nn.Linear(dim, vocab)).cuda()
        opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
        data = torch.randint(0, vocab, (rows + 1,), device="cuda")
        curve = []
        for _ in range(50):
            opt.zero_grad()
            loss = loss_fn(net(data[:-1]), data[1:], label_smoothing=0.05)
            loss.backward()
            opt.step()
            curve.append(loss.item())
        curves.append(torch.tensor(curve, dtype=torch.float64))
    ours, eager = curves
    assert ((ours - eager).abs() <= 1e-4 * eager.abs()).all(), (ours - eager).abs().max()
    assert ours[-1] < 0.5 * ours[0]  # it learned
