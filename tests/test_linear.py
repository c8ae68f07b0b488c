"""linear_cross_entropy: cross_entropy(F.linear(input, linear_weight, linear_bias), target, ...) with
the logits a chunk of rows at a time. On the CPU (PyTorch's operations for each chunk) the loop's
arithmetic: every option and reduction, incoming gradients, chunk boundaries, empty and ignored
batches, the chunks' sizes, the errors, the module, torch.compile. On the GPU (the kernels for each
chunk) every dtype against float64, odd sizes, N*V over 2^31, determinism, no host synchronization,
CUDA graphs, torch.compile, autocast and the memory a step adds."""
import itertools

import pytest
import torch
import torch.nn.functional as F

import crossent
from crossent import linear
from crossent.linear import LinearCrossEntropyLoss, linear_cross_entropy

OPTIONS = [dict(), dict(reduction="sum"), dict(reduction="none"), dict(label_smoothing=0.2), dict(weight=True),
           dict(z_loss=1e-2), dict(softcap=3.0), dict(return_lse=True), dict(ignore_index=3, reduction="sum"),
           dict(weight=True, label_smoothing=0.1, z_loss=1e-3, softcap=4.0, return_lse=True),
           dict(weight=True, label_smoothing=0.1, reduction="none", return_lse=True)]


def _operands(rows, dim, classes, dtype, device="cpu", bias=False, ignore_index=-100, seed=0):
    """x (rows, dim), w (classes, dim), b or None, targets with every fourth row ignored: logits of a
    few units, as a trained head gives."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, dim, generator=generator, dtype=torch.float64)
    w = torch.randn(classes, dim, generator=generator, dtype=torch.float64) * 2 / dim**0.5
    b = torch.randn(classes, generator=generator, dtype=torch.float64) if bias else None
    t = torch.randint(0, classes, (rows,), generator=generator)
    t[::4] = ignore_index
    cast = lambda a: None if a is None else a.to(device=device, dtype=dtype).requires_grad_()  # noqa: E731
    return cast(x), cast(w), cast(b), t.to(device)


def _kwargs(opts, classes, dtype, device="cpu"):
    kwargs = dict(opts)
    if kwargs.pop("weight", False):
        kwargs["weight"] = (torch.rand(classes, dtype=torch.float64) + 0.5).to(device=device, dtype=dtype)
    return kwargs


def _step(loss_fn, x, w, b, t, kwargs, seed=1):
    """The loss (and lse), and the gradients of x, w, b for random incoming gradients of each output."""
    outputs = loss_fn(x, w, b, t, kwargs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    generator = torch.Generator().manual_seed(seed)
    grads = [torch.rand(o.shape, generator=generator, dtype=torch.float64).to(o) for o in outputs]
    params = [p for p in (x, w, b) if p is not None]
    return outputs, torch.autograd.grad(outputs, params, grads)


def _chunked(chunk_size):
    return lambda x, w, b, t, kwargs: linear_cross_entropy(x, w, t, linear_bias=b, chunk_size=chunk_size, **kwargs)


def _unchunked(x, w, b, t, kwargs):
    return crossent.cross_entropy(F.linear(x, w, b), t, **kwargs)


# ------------------------------------------------------------------ on the CPU
@pytest.mark.parametrize("chunk_size", [1, 3, 8, 23, 100])
@pytest.mark.parametrize("bias", [False, True])
def test_every_option_is_the_unchunked_loss_on_the_cpu(chunk_size, bias):
    """In float64, for every option, reduction and chunking (23 rows: chunks of 3 leave 2, of 8 leave
    7), the loss, the lse and every gradient are those of the linear layer's logits, to rounding."""
    for opts in OPTIONS:
        x, w, b, t = _operands(23, 6, 11, torch.float64, bias=bias, ignore_index=opts.get("ignore_index", -100))
        kwargs = _kwargs(opts, 11, torch.float64)
        got, got_grads = _step(_chunked(chunk_size), x, w, b, t, kwargs)
        want, want_grads = _step(_unchunked, x, w, b, t, kwargs)
        for g, e in zip(got + got_grads, want + want_grads):
            assert g.dtype == e.dtype and g.shape == e.shape, opts
            torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-13, msg=str(opts))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpus_lower_precisions_are_float64s_loss_rounded(dtype):
    """float32 and bfloat16 operands: the loss and gradients within the dtype's rounding of float64's
    (the logits themselves are rounded to the dtype, as F.linear's are)."""
    eps = torch.finfo(dtype).eps
    for opts in OPTIONS[:5]:
        x, w, b, t = _operands(40, 16, 50, dtype, bias=True)
        x64, w64, b64 = (a.detach().double().requires_grad_() for a in (x, w, b))
        kwargs = _kwargs(opts, 50, dtype)
        kwargs64 = {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        got, got_grads = _step(_chunked(16), x, w, b, t, kwargs)
        want, want_grads = _step(_unchunked, x64, w64, b64, t, kwargs64)
        for g, e in zip(got + got_grads, want + want_grads):
            assert g.dtype == dtype
            assert (g.double() - e).abs().max() <= 8 * eps * e.abs().max(), opts


def test_inputs_of_any_leading_shape():
    """input (..., D) with targets (...): the loss per row in the targets' shape; one row (D,) with a
    0-dim target is cross_entropy's of logits (V,)."""
    x, w, b, t = _operands(12, 5, 7, torch.float64, bias=True)
    x3, t3 = x.detach().reshape(2, 2, 3, 5).requires_grad_(), t.reshape(2, 2, 3)
    for reduction in ("mean", "sum", "none"):
        got = linear_cross_entropy(x3, w, t3, linear_bias=b, reduction=reduction, chunk_size=5)
        want = crossent.cross_entropy(F.linear(x3, w, b).movedim(-1, 1), t3, reduction=reduction)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    for target in (t[1], t[0]):  # a class, and the ignore index
        got = linear_cross_entropy(x[1], w, target, linear_bias=b)
        torch.testing.assert_close(got, crossent.cross_entropy(F.linear(x[1], w, b), target), equal_nan=True)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_no_rows_and_no_counted_rows(reduction):
    """No rows: the mean NaN (0 / 0), the sum 0, an empty loss per row, zero gradients. Every target
    ignored: the same loss as PyTorch's, and gradients 0, not 0 * inf."""
    for rows, ignored in ((0, False), (9, True)):
        x, w, b, t = _operands(rows, 4, 6, torch.float64, bias=True)
        if ignored:
            t = torch.full_like(t, -100)
        got, got_grads = _step(_chunked(2), x, w, b, t, dict(reduction=reduction))
        want, want_grads = _step(_unchunked, x, w, b, t, dict(reduction=reduction))
        torch.testing.assert_close(got[0], want[0], equal_nan=True)
        for g, e in zip(got_grads, want_grads):
            assert torch.equal(g, e) and not g.any()


def test_a_chunk_is_the_most_logits_that_exist(monkeypatch):
    """Every logits tensor the loop makes has at most chunk_size rows, the chunks cover the rows
    once in the forward and once more in a backward that makes them again (reduction none)."""
    made = []
    logits_of = linear._logits
    monkeypatch.setattr(linear, "_logits", lambda x, w, b: made.append(x.shape[0]) or logits_of(x, w, b))
    x, w, b, t = _operands(23, 6, 11, torch.float64)
    linear_cross_entropy(x, w, t, chunk_size=5).backward()
    assert made == [5, 5, 5, 5, 3]
    made.clear()
    linear_cross_entropy(x, w, t, chunk_size=5, reduction="none").sum().backward()
    assert made == [5, 5, 5, 5, 3] * 2


def test_the_chunks_size():
    """A chunk's logits within CHUNK_BYTES unless one row exceeds them; chunk_size as given; a
    chunk_size that is not a positive integer is refused."""
    assert linear.chunk_rows(8192, 128256, 2) * 128256 * 2 <= linear.CHUNK_BYTES
    assert linear.chunk_rows(8192, 128256, 2) > linear.chunk_rows(8192, 256000, 2) > 1
    assert linear.chunk_rows(10, 1000, 4) == 10
    assert linear.chunk_rows(10, 2**40, 4) == 1
    assert linear.chunk_rows(10, 1000, 4, chunk_size=3) == 3
    assert linear.chunk_rows(10, 1000, 4, chunk_size=torch.tensor(4)) == 4  # anything with __index__
    for bad in (0, -1, 2.0, True, "8"):
        with pytest.raises(ValueError):
            linear.chunk_rows(10, 10, 4, chunk_size=bad)


def test_mistakes_raise_pytorchs_exception_types():
    x, w, b, t = _operands(6, 4, 5, torch.float64)
    mistakes = [
        (RuntimeError, lambda: linear_cross_entropy(x, w[:, :3], t)),            # D differs
        (RuntimeError, lambda: linear_cross_entropy(x, w, t, linear_bias=torch.zeros(4, dtype=torch.float64))),
        (ValueError, lambda: linear_cross_entropy(x, w, t[:5])),                  # batch sizes differ
        (RuntimeError, lambda: linear_cross_entropy(x, w, t.double())),           # probabilities: not taken
        (ValueError, lambda: linear_cross_entropy(x, w, t, reduction="avg")),
        (RuntimeError, lambda: linear_cross_entropy(x, w, t, label_smoothing=1.5)),
        (ValueError, lambda: linear_cross_entropy(x, w, t, chunk_size=0)),
        (TypeError, lambda: linear_cross_entropy(x, w.tolist(), t)),
        (IndexError, lambda: linear_cross_entropy(x, w, t.index_fill(0, torch.tensor([1]), 5))),  # a target past V
    ]
    for kind, call in mistakes:
        with pytest.raises(kind):
            call()


def test_the_module_is_the_function():
    """LinearCrossEntropyLoss holds the options (the class weights a buffer, moved with the module)
    and computes linear_cross_entropy."""
    x, w, b, t = _operands(10, 4, 6, torch.float64, bias=True)
    weight = torch.rand(6, dtype=torch.float64) + 0.5
    module = LinearCrossEntropyLoss(weight, label_smoothing=0.1, z_loss=1e-3, reduction="sum", chunk_size=3)
    assert "weight" in dict(module.named_buffers())
    torch.testing.assert_close(module(x, w, t, b), linear_cross_entropy(
        x, w, t, linear_bias=b, weight=weight, label_smoothing=0.1, z_loss=1e-3, reduction="sum"), rtol=1e-14, atol=0)
    with pytest.raises(ValueError):
        LinearCrossEntropyLoss(chunk_size=-2)
    assert repr(module) == "LinearCrossEntropyLoss(reduction=sum, label_smoothing=0.1, z_loss=0.001, chunk_size=3)"


def test_torch_compile_traces_it_whole():
    """fullgraph=True: no graph break; the compiled loss and gradients are eager's, for rows and for
    (batch, sequence, D) inputs with every row's loss and lse."""
    x, w, b, t = _operands(16, 8, 12, torch.float32, bias=True)
    x3, t3 = x.detach().reshape(2, 8, 8).requires_grad_(), t.reshape(2, 8)
    for x, t, opts in [(x, t, dict(label_smoothing=0.1, z_loss=1e-3)), (x3, t3, dict(reduction="none", return_lse=True))]:
        compiled = torch.compile(_chunked(5), fullgraph=True)
        got, got_grads = _step(compiled, x, w, b, t, opts)
        want, want_grads = _step(_chunked(5), x, w, b, t, opts)
        for g, e in zip(got + got_grads, want + want_grads):
            assert g.shape == e.shape
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


def test_autocast_on_the_cpu_casts_as_a_linear_layer():
    """float32 parameters under the CPU's autocast: the loss of their bf16 casts, in float32, and
    float32 gradients."""
    x, w, b, t = _operands(20, 8, 12, torch.float32, bias=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, got_grads = _step(_chunked(6), x, w, b, t, {})
    want = linear_cross_entropy(*(a.detach().bfloat16() for a in (x, w)), t,
                                linear_bias=b.detach().bfloat16(), chunk_size=6)
    assert got[0].dtype == torch.float32 and all(g.dtype == torch.float32 for g in got_grads)
    torch.testing.assert_close(got[0], want.float(), rtol=2**-7, atol=0)


def test_what_autocast_leaves_and_pytorchs_other_conventions():
    """Under autocast float64 operands stay float64 (autocast casts no float64), as F.linear's do; a
    hidden size of 0; torch 2.13's ignore_index=None for -100; class weights that require grad refused
    as PyTorch refuses them."""
    x, w, b, t = _operands(10, 4, 6, torch.float64, bias=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = linear_cross_entropy(x, w, t, linear_bias=b, chunk_size=3), _unchunked(x, w, b, t, {})
    assert got.dtype == want.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    empty_x, empty_w = torch.randn(5, 0, dtype=torch.float64), torch.randn(6, 0, dtype=torch.float64)
    t5 = t[:5]
    torch.testing.assert_close(linear_cross_entropy(empty_x, empty_w, t5), _unchunked(empty_x, empty_w, None, t5, {}))
    torch.testing.assert_close(linear_cross_entropy(x, w, t, ignore_index=None), linear_cross_entropy(x, w, t))
    with pytest.raises(RuntimeError, match="derivative for 'weight'"):
        linear_cross_entropy(x, w, t, weight=torch.rand(6, dtype=torch.float64, requires_grad=True))


def _opcheck(device, steps):
    x, w, b, t = _operands(9, 4, 6, torch.float32, device, bias=True)
    for fused, reduction in steps:
        args = (x, w, b, t, None, -100, reduction, 0.1, 1e-3, 0.0, False, fused, True, True, True, 4, False,
                device != "cpu")
        torch.library.opcheck(linear.forward_op, args, test_utils=("test_schema", "test_autograd_registration",
                                                                    "test_faketensor"))


def test_the_operator_passes_torchs_checks():
    """The forward operator's schema, fake tensors and autograd registration (torch.library.opcheck),
    for a step that makes the logits again in the backward: on the CPU, a fused step's gradient is
    torch.func.vjp's, which does not run under opcheck's dispatch modes (the GPU test checks it)."""
    _opcheck("cpu", [(False, "none"), (False, "mean")])


# ------------------------------------------------------------------ on the GPU
GPU_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _float64_step(x, w, b, t, kwargs, seed=1):
    x64, w64 = (a.detach().double().requires_grad_() for a in (x, w))
    b64 = None if b is None else b.detach().double().requires_grad_()
    kwargs = {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    return _step(_unchunked, x64, w64, b64, t, kwargs, seed)


def _assert_rounded(got, want, dtype, what, terms=1):
    """Within a few roundings of the dtype of float64's, relative to the largest magnitude, plus a
    float32 sum's rounding over `terms` (a matmul's inner length: its error grows as its square root):
    float64's value as the dtype holds it (inf past its range, as a float16 sum of many rows), NaN
    where it is."""
    want = want.to(got.dtype).double()
    assert got.dtype == dtype or what.startswith(("loss", "lse")), what
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf()), what
    finite = want.isfinite()
    if finite.any():
        eps = 16 * torch.finfo(dtype).eps + 2 * terms ** 0.5 * torch.finfo(torch.float32).eps
        error, bound = (got.double()[finite] - want[finite]).abs().max().item(), eps * want[finite].abs().max().item()
        assert error <= bound, f"{what}: {error:.3e} > {bound:.3e}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("shape", [(257, 64, 1000, 64), (37, 256, 100, 16), (8191, 32, 50257, 3000)], ids=str)
def test_every_option_on_the_gpu_is_float64s_rounded(dtype, shape):
    """N x D x V with rows per chunk: odd sizes (V = 50257, N = 8191), V < D, several chunks and a last
    short one. Loss, lse and the three gradients, with random incoming gradients, against float64."""
    rows, dim, classes, chunk = shape
    for opts, bias in itertools.product(OPTIONS, (False, True)):
        x, w, b, t = _operands(rows, dim, classes, dtype, "cuda", bias, opts.get("ignore_index", -100))
        kwargs = _kwargs(opts, classes, dtype, "cuda")
        got, got_grads = _step(_chunked(chunk), x, w, b, t, kwargs)
        want, want_grads = _float64_step(x, w, b, t, kwargs)
        names = (["loss", "lse"] if len(got) > 1 else ["loss"]) + ["dx", "dw", "db"][:len(got_grads)]
        terms = {"dx": classes, "dw": rows, "db": rows}
        for g, e, what in zip(got + got_grads, want + want_grads, names):
            _assert_rounded(g, e, dtype, f"{what} {opts} bias={bias}", terms.get(what, 1))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_the_rounding_launch_is_the_float32_product_rounded(dtype):
    """The backward's rounding of a float32 sum (gradient.round_scaled): total * factor in float32,
    rounded once to the dtype, bit for bit, with a factor a row or one for all, 0, inf and NaN among
    them; rows of whole vectors, rows that are not (the element loop), a sum or a result off the 16-byte
    grid, and more pieces than the launch's threads."""
    generator = torch.Generator(device="cuda").manual_seed(3)
    cases = ((257, 4096, 0, 0), (2048, 4096, 0, 0), (33, 1000, 0, 0), (5, 7, 0, 0), (64, 256, 1, 0), (64, 256, 0, 1),
             (1, 50257, 0, 0))  # (2048, 4096): more pieces than the grid's threads; offsets: off the 16-byte grid
    for rows, cols, offset, out_offset in cases:
        base = torch.randn(rows * cols + offset, generator=generator, device="cuda") * 1e3
        total = base[offset:].view(rows, cols)
        out = torch.empty(rows * cols + out_offset, dtype=dtype, device="cuda")[out_offset:].view(rows, cols)
        for factors in (torch.rand(rows, generator=generator, device="cuda"), torch.rand((), device="cuda")):
            if factors.dim():
                factors[::3], factors[1::5] = 0, float("inf")
                factors[2::7] = float("nan")
            got = crossent.gradient.round_scaled(total, factors, out)
            want = (total * (factors[:, None] if factors.dim() else factors)).to(dtype)
            assert torch.equal(got.isnan(), want.isnan()), (rows, cols, offset, out_offset)
            assert torch.equal(got.nan_to_num(), want.nan_to_num()), (rows, cols, offset, out_offset)


@pytest.mark.gpu
def test_rows_that_do_not_count_on_the_gpu():
    """Every target ignored: gradients 0, not 0 * inf; class weights summing to 0 over the counted
    rows: PyTorch's NaN there and 0 on the ignored rows."""
    x, w, b, t = _operands(64, 32, 1000, torch.bfloat16, "cuda", bias=True)
    for targets, weight in ((torch.full_like(t, -100), None), (t, torch.zeros(1000, device="cuda").bfloat16())):
        got, got_grads = _step(_chunked(16), x, w, b, targets, dict(weight=weight))
        want, want_grads = _step(_unchunked, x, w, b, targets, dict(weight=weight))
        torch.testing.assert_close(got[0], want[0].to(got[0].dtype), equal_nan=True)
        for g, e in zip(got_grads, want_grads):
            assert torch.equal(g.isnan(), e.isnan()) and not g.nan_to_num().any() and not e.nan_to_num().any()


@pytest.mark.gpu
def test_the_operator_passes_torchs_checks_on_the_gpu():
    _opcheck("cuda", [(True, "mean"), (True, "sum"), (False, "none")])


@pytest.mark.gpu
def test_more_logits_than_32_bit_offsets_reach():
    """N x V over 2^31 in one chunk (bf16, 4.3 GB of logits): the loss and dx of rows on both sides of
    element 2^31 match float64's, computed a block of rows at a time."""
    rows, dim, classes = 16400, 16, 131072
    x, w, _, t = _operands(rows, dim, classes, torch.bfloat16, "cuda")
    loss = linear_cross_entropy(x, w, t, reduction="none", chunk_size=rows)
    dx, = torch.autograd.grad(loss.sum(), x)
    for start in (0, 16380):  # element 2^31 lies in row 16384
        xs = x[start:start + 20].detach().double().requires_grad_()
        want = crossent.cross_entropy(F.linear(xs, w.double()), t[start:start + 20], reduction="none")
        want_dx, = torch.autograd.grad(want.sum(), xs)
        _assert_rounded(loss[start:start + 20], want, torch.bfloat16, "loss")
        _assert_rounded(dx[start:start + 20], want_dx, torch.bfloat16, "dx")


@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_a_step_is_deterministic_and_never_synchronizes(reduction):
    """Two steps give the same bits, and neither waits on the GPU (CUDA's sync debug mode raises on a
    synchronizing call)."""
    x, w, b, t = _operands(3000, 64, 5000, torch.bfloat16, "cuda", bias=True)
    results = []
    for _ in range(2):
        torch.cuda.set_sync_debug_mode("error")
        try:
            loss = linear_cross_entropy(x, w, t, linear_bias=b, reduction=reduction, chunk_size=700)
            grads = torch.autograd.grad(loss.sum(), (x, w, b))
        finally:
            torch.cuda.set_sync_debug_mode("default")
        results.append((loss, *grads))
    for a, c in zip(*results):
        assert torch.equal(a, c)


@pytest.mark.gpu
def test_a_cuda_graph_replays_the_step():
    """The forward and backward captured in a CUDA graph and replayed on new inputs give eager's
    results."""
    x, w, _, t = _operands(1024, 64, 3000, torch.bfloat16, "cuda")
    x_static, t_static = x.detach().clone().requires_grad_(), t.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm up: builds, plans and workspaces outside the capture
            linear_cross_entropy(x_static, w, t_static, chunk_size=300).backward()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    x_static.grad = w.grad = None
    with torch.cuda.graph(graph):
        loss_static = linear_cross_entropy(x_static, w, t_static, chunk_size=300)
        dx_static, dw_static = torch.autograd.grad(loss_static, (x_static, w))
    x2, _, _, t2 = _operands(1024, 64, 3000, torch.bfloat16, "cuda", seed=5)
    with torch.no_grad():
        x_static.copy_(x2)
    t_static.copy_(t2)
    graph.replay()
    loss = linear_cross_entropy(x2, w, t2, chunk_size=300)
    dx, dw = torch.autograd.grad(loss, (x2, w))
    for a, e in ((loss_static, loss), (dx_static, dx), (dw_static, dw)):
        torch.testing.assert_close(a, e)  # bf16's tolerance: cuBLAS may choose another algorithm in a capture


@pytest.mark.gpu
def test_torch_compile_on_the_gpu_is_eagers():
    x, w, b, t = _operands(500, 64, 2000, torch.bfloat16, "cuda", bias=True)
    opts = dict(label_smoothing=0.1, z_loss=1e-3, softcap=20.0)
    for fn_opts in (opts, dict(opts, reduction="none", return_lse=True)):
        got, got_grads = _step(torch.compile(_chunked(128), fullgraph=True), x, w, b, t, fn_opts)
        want, want_grads = _step(_chunked(128), x, w, b, t, fn_opts)
        for g, e in zip(got[:1] + got_grads, want[:1] + want_grads):  # the operator's: the same bits
            assert torch.equal(g, e)
        for g, e in zip(got[1:], want[1:]):  # the lse, m + log s: the compiler's log
            torch.testing.assert_close(g, e, rtol=1e-6, atol=0)


@pytest.mark.gpu
def test_torch_compile_under_autocast_with_float32_class_weights():
    """bf16 logits with float32 class weights, which the kernels do not take: compiled, the call is
    traced unchunked, and its loss and gradients are eager's chunked ones, to bf16's rounding."""
    x, w, b, t = _operands(300, 64, 1000, torch.float32, "cuda", bias=True)
    kwargs = {"weight": torch.rand(1000, device="cuda") + 0.5, "label_smoothing": 0.1}
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got, got_grads = _step(torch.compile(_chunked(100), fullgraph=True), x, w, b, t, kwargs)
        want, want_grads = _step(_chunked(100), x, w, b, t, kwargs)
    for g, e in zip(got + got_grads, want + want_grads):
        torch.testing.assert_close(g, e, rtol=2**-6, atol=2**-6 * e.abs().max().item())


@pytest.mark.gpu
def test_autocast_casts_as_a_linear_layer_and_gives_a_float32_loss():
    """float32 parameters under autocast: the bf16 operands' loss and gradients, in float32 (the
    gradients in the parameters' dtype)."""
    x, w, b, t = _operands(300, 64, 1000, torch.float32, "cuda", bias=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got, got_grads = _step(_chunked(100), x, w, b, t, {})
    x16, w16, b16 = (a.detach().bfloat16().requires_grad_() for a in (x, w, b))
    want = linear_cross_entropy(x16, w16, t, linear_bias=b16, chunk_size=100)
    assert got[0].dtype == torch.float32 and all(g.dtype == torch.float32 for g in got_grads)
    torch.testing.assert_close(got[0], want.float(), rtol=2**-7, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_a_step_adds_its_gradients_one_chunk_and_the_accumulators(reduction):
    """The step's peak over its inputs: dx and dW, their float32 accumulators, one chunk's logits and
    a few rows' worth of small tensors, and nothing of N x V."""
    rows, dim, classes, chunk = 8192, 256, 32000, 1024
    x, w, _, t = _operands(rows, dim, classes, torch.bfloat16, "cuda")
    linear_cross_entropy(x, w, t, reduction=reduction, chunk_size=chunk).sum().backward()  # builds, plans
    x.grad = w.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    linear_cross_entropy(x, w, t, reduction=reduction, chunk_size=chunk).sum().backward()
    torch.cuda.synchronize()
    added = torch.cuda.max_memory_allocated() - base
    gradients = (rows + classes) * dim * (2 + 4)  # dx and dW, each with its float32 accumulator
    assert added <= gradients + chunk * classes * 2 + rows * 64 + (8 << 20), added
    assert added < rows * classes * 2  # the logits of every row never exist
