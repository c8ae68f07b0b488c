"""The public API as a drop-in for PyTorch's loss: F.cross_entropy's and nn.CrossEntropyLoss's
arguments in their order, PyTorch's exception types for the same mistakes, PyTorch's operations
where the kernels do not apply (the CPU here; float64 and other target dtypes on the GPU), autocast's
float32 loss, and PyTorch's CUDA result for one sample whose target is ignored."""
import itertools

import pytest
import torch
import torch.nn.functional as F

import crossent
from crossent import composite, inputs
from cases import expected_loss, logits, targets

OPTIONS = [dict(), dict(reduction="sum"), dict(reduction="none"), dict(ignore_index=2), dict(label_smoothing=0.1),
           dict(weight=True), dict(weight=True, label_smoothing=0.2, reduction="sum")]
EXTRAS = [dict(z_loss=1e-2), dict(softcap=3.0), dict(return_lse=True), dict(z_loss=1e-3, softcap=2.0, weight=True,
                                                                             return_lse=True, reduction="none")]


def _weighted(kwargs, cols, dtype=torch.float64, device="cpu"):
    kwargs = dict(kwargs)
    if kwargs.pop("weight", False):
        kwargs["weight"] = torch.rand(cols, dtype=torch.float64, device=device).to(dtype) + 0.5
    return kwargs


def _inputs(shape, dtype, probs=False, device="cpu", ignore_index=-100):
    generator = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=generator, dtype=torch.float64) * 3).to(dtype).to(device)
    cols = shape[1] if len(shape) > 1 else shape[0]
    if probs:
        return x, torch.softmax(torch.randn(shape, generator=generator, dtype=torch.float64), 1 if len(shape) > 1 else 0).to(dtype).to(device)
    t = torch.randint(0, cols, shape[:1] + shape[2:] if len(shape) > 1 else (), generator=generator).to(device)
    return x, t.masked_fill(t == 1, ignore_index) if t.dim() else t


# ------------------------------------------------------------------ on the CPU
@pytest.mark.parametrize("shape", [(7, 5), (5,), (3, 5, 4), (0, 5)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_pytorchs_options_on_the_cpu_are_pytorchs_own(shape, dtype):
    """Where the kernels do not apply, PyTorch's options give F.cross_entropy's very bits, and its
    gradient."""
    for opts, probs in itertools.product(OPTIONS, (False, True)):
        if probs and "ignore_index" in opts:
            continue
        x, t = _inputs(shape, dtype, probs, ignore_index=opts.get("ignore_index", -100))
        kwargs = _weighted(opts, x.shape[1] if x.dim() > 1 else x.shape[0], dtype)
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        got, want = crossent.cross_entropy(a, t, **kwargs), F.cross_entropy(b, t, **kwargs)
        assert got.dtype == want.dtype, opts
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True, msg=str(opts))  # the same bits
        if got.numel() and not got.isnan().any():
            g = torch.rand(got.shape, dtype=got.dtype)
            (got * g).sum().backward(), (want * g).sum().backward()
            assert torch.equal(a.grad, b.grad), opts


@pytest.mark.parametrize("shape", [(7, 5), (5,), (3, 5, 4)], ids=str)
def test_the_extras_on_the_cpu_match_float64(shape):
    """z_loss, softcap and the lse by PyTorch's operations, as the kernels define them (cases.expected_loss)."""
    for opts, probs in itertools.product(EXTRAS + [dict(z_loss=1e-2, ignore_index=0, label_smoothing=0.1)], (False, True)):
        if probs and "ignore_index" in opts:
            continue
        x, t = _inputs(shape, torch.float64, probs, ignore_index=opts.get("ignore_index", -100))
        kwargs = _weighted(opts, x.shape[1] if x.dim() > 1 else x.shape[0])
        got = crossent.cross_entropy(x, t, **kwargs)
        loss, lse = got if kwargs.get("return_lse") else (got, None)
        reference = {k: v for k, v in kwargs.items() if k != "return_lse"}
        torch.testing.assert_close(loss, expected_loss(x, t, **reference), rtol=1e-12, atol=1e-12, equal_nan=True)
        if lse is not None:
            cap = kwargs.get("softcap")
            capped = cap * torch.tanh(x / cap) if cap else x
            torch.testing.assert_close(lse, torch.logsumexp(capped, 1 if x.dim() > 1 else 0))


def test_pytorchs_positional_order_and_its_deprecated_arguments():
    x, t = _inputs((6, 4), torch.float32)
    w = torch.rand(4) + 0.5
    assert torch.equal(crossent.cross_entropy(x, t, None, None, -100, None, "sum"), F.cross_entropy(x, t, reduction="sum"))
    assert torch.equal(crossent.cross_entropy(x, t, w, None, -100, None, "none", 0.1),
                       F.cross_entropy(x, t, w, None, -100, None, "none", 0.1))
    for size_average, reduce in [(False, None), (None, False), (True, True)]:
        with pytest.warns(UserWarning):
            want = F.cross_entropy(x, t, size_average=size_average, reduce=reduce)
        with pytest.warns(UserWarning):
            got = crossent.cross_entropy(x, t, size_average=size_average, reduce=reduce)
        assert torch.equal(got, want)


def test_the_module_is_pytorchs_module():
    w = torch.rand(5, dtype=torch.float64) + 0.5
    loss = crossent.CrossEntropyLoss(w, ignore_index=1, label_smoothing=0.1, z_loss=1e-3)
    assert isinstance(loss, torch.nn.CrossEntropyLoss) and list(dict(loss.named_buffers())) == ["weight"]
    assert "z_loss=0.001" in repr(loss)
    x, t = _inputs((8, 5), torch.float64)
    torch.testing.assert_close(loss(x, t), expected_loss(x, t, 1, "mean", w, 1e-3, 0.1), rtol=1e-12, atol=0)
    loss.reduction, loss.z_loss = "sum", 0.0  # read at each call, as PyTorch's module reads them
    assert torch.equal(loss(x, t), F.cross_entropy(x, t, w, ignore_index=1, reduction="sum",
                                                   label_smoothing=0.1))
    with pytest.warns(UserWarning):
        assert crossent.CrossEntropyLoss(size_average=False).reduction == "sum"
    with pytest.raises(TypeError, match="z_loss must be a number"):
        crossent.CrossEntropyLoss(z_loss="1")


MISTAKES = {  # a mistake, as (logits, targets, options); a CPU tensor of each
    "batch sizes differ": lambda x, t: (x, t[:3], {}),
    "targets of two dimensions": lambda x, t: (x, t[:, None], {}),
    "0-dim logits": lambda x, t: (x[0, 0], t[0], {}),
    "probabilities of another shape": lambda x, t: (x, torch.rand(4, 6), {}),
    "(N, C, d) targets of another shape": lambda x, t: (x[:, :, None], t[:, None].expand(4, 2), {}),
    "weight of another size": lambda x, t: (x, t, {"weight": torch.ones(3)}),
    "weight of another dtype": lambda x, t: (x, t, {"weight": torch.ones(5, dtype=torch.float64)}),
    "ignore_index with probabilities": lambda x, t: (x, torch.rand(4, 5), {"ignore_index": 0}),
    "label_smoothing over 1": lambda x, t: (x, t, {"label_smoothing": 1.5}),
    "a bad reduction": lambda x, t: (x, t, {"reduction": "avg"}),
    "ignore_index not an integer": lambda x, t: (x, t, {"ignore_index": 1.5}),
    "weight not a tensor": lambda x, t: (x, t, {"weight": [1.0] * 5}),
    "targets not a tensor": lambda x, t: (x, t.tolist(), {}),
}


def _raised(call):
    try:
        call()
    except Exception as error:  # noqa: BLE001: the type is what is compared
        return error
    return None


@pytest.mark.parametrize("mistake", MISTAKES)
def test_each_mistake_raises_pytorchs_exception_type(mistake):
    """The same type as F.cross_entropy's for the same mistake: from cross_entropy (PyTorch's own on
    the CPU), and from the kernels' own checks (inputs.check_options, check_weight, check_inputs),
    which ModelNew and GPU tensors meet, each raising before check_inputs' refusal of CPU tensors.
    (prepare's refusal of ignore_index with probabilities needs GPU tensors: tests/test_streamed.py.)"""
    x, t, opts = MISTAKES[mistake](torch.randn(4, 5), torch.randint(0, 5, (4,)))
    want = type(_raised(lambda: F.cross_entropy(x, t, **opts)))
    assert want is not type(None)
    assert type(_raised(lambda: crossent.cross_entropy(x, t, **opts))) is want
    if mistake == "ignore_index with probabilities":
        return

    def kernels_checks():
        options = inputs.check_options(**opts)
        if options.weight is not None:
            inputs.check_weight(options.weight, x)
        inputs.check_inputs(x, t)  # its device check comes last
    error = _raised(kernels_checks)
    assert type(error) is want and "CUDA tensors" not in str(error), error


def test_modelnew_never_falls_back():
    x, t = _inputs((4, 5), torch.float32)
    with pytest.raises(RuntimeError, match="the kernels take CUDA tensors"):
        crossent.ModelNew()(x, t)
    with pytest.raises(RuntimeError, match="the kernels take float32, bfloat16 or float16 logits"):
        crossent.ModelNew()(x.double(), t)
    with pytest.raises(RuntimeError, match="int64 or int32 class-index targets"):
        crossent.ModelNew()(x, t.to(torch.uint8))


def test_what_the_kernels_take():
    x, t = _inputs((4, 5), torch.float32)
    assert not crossent.api.kernels_take(x, t, inputs.DEFAULTS)  # the CPU


def test_composite_under_cpu_autocast_reads_float32_as_pytorch_does():
    x, t = _inputs((6, 5), torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = F.cross_entropy(x, t)
        got = crossent.cross_entropy(x, t)
        loss, lse = crossent.cross_entropy(x, t, return_lse=True)
    assert got.dtype == want.dtype == torch.float32 and torch.equal(got, want)
    torch.testing.assert_close(loss, want)  # through the lse's path, which composes PyTorch's operations
    assert lse.dtype == torch.float32 and torch.equal(lse, torch.logsumexp(x.float(), 1))
    assert composite.composite_loss(x, t, inputs.DEFAULTS._replace(float32_loss=True)).dtype == torch.float32


# ------------------------------------------------------------------ on the GPU
@pytest.mark.gpu
def test_what_the_kernels_do_not_take_on_the_gpu_is_pytorchs():
    """float64 logits, uint8 targets, float64 probabilities: F.cross_entropy's bits and gradient."""
    x, t = logits(64, 100, torch.float32), targets(64, 100)
    for a, b in [(x.double(), t), (x, t.to(torch.uint8)), (x, torch.softmax(x, 1).double())]:
        y1, y2 = a.clone().requires_grad_(), a.clone().requires_grad_()
        got, want = crossent.cross_entropy(y1, b, label_smoothing=0.1), F.cross_entropy(y2, b, label_smoothing=0.1)
        assert got.dtype == want.dtype and torch.equal(got, want)
        got.backward(), want.backward()
        assert torch.equal(y1.grad, y2.grad)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("opts", [dict(), dict(reduction="none"), dict(reduction="sum", label_smoothing=0.1),
                                  dict(weight=True), dict(probs=True), dict(z_loss=1e-3, return_lse=True)], ids=str)
def test_autocast_gives_a_float32_loss_from_the_logits_as_they_are(dtype, opts):
    """Under autocast, PyTorch's dtypes (a float32 loss, the logits' dtype for their gradient) and a
    loss within float32's rounding of float64's: no 16-bit rounding of the loss."""
    opts = dict(opts)
    x = logits(512, 1000, dtype)
    t = torch.softmax(logits(512, 1000, torch.float32), 1).to(dtype) if opts.pop("probs", False) else targets(512, 1000)
    kwargs = _weighted(opts, 1000, dtype, "cuda")
    y = x.clone().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = crossent.cross_entropy(y * 1, t, **kwargs)
        want = F.cross_entropy(x, t, **{k: v for k, v in kwargs.items() if k not in ("z_loss", "return_lse")})
    loss = out[0] if kwargs.get("return_lse") else out
    assert loss.dtype == want.dtype == torch.float32
    reference = expected_loss(x, t, **{k: v for k, v in kwargs.items() if k != "return_lse"})
    torch.testing.assert_close(loss.double(), reference, rtol=2e-6, atol=1e-6)
    loss.float().sum().backward()
    assert y.grad.dtype == dtype


@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_one_sample_with_its_target_ignored_is_pytorchs_cuda_result(reduction, dtype):
    """Logits (C,): PyTorch's CUDA loss is 0 where the target is ignored (the mean too, with no
    label smoothing), NaN for the mean where its class weighs 0; and the loss otherwise."""
    x = logits(1, 50, dtype)[0]
    w = torch.rand(50, device="cuda").to(dtype) + 0.5
    w[7] = 0
    for target, weight, eps, z in itertools.product((-100, 3, 7), (None, w), (0.0, 0.1), (0.0, 1e-3)):
        t = torch.tensor(target, device="cuda")
        got = crossent.cross_entropy(x, t, weight, reduction=reduction, label_smoothing=eps, z_loss=z)
        want = F.cross_entropy(x.float(), t, None if weight is None else weight.float(), reduction=reduction,
                               label_smoothing=eps)
        if z and target != -100:
            want = want + z * torch.logsumexp(x.float(), 0) ** 2 / (
                1 if weight is None or reduction != "mean" else weight[target].float())
        # where PyTorch's is not finite, ours is not either (a mean over a weight of 0 with label smoothing
        # or z_loss: its NaN, or the inf of their term over 0)
        assert got.dtype == dtype and got.isfinite() == want.isfinite(), (target, weight is None, eps, z)
        if want.isfinite():
            torch.testing.assert_close(got.float(), want, rtol=1e-2 if dtype != torch.float32 else 1e-5, atol=1e-5)


@pytest.mark.gpu
def test_autocast_under_torch_compile_is_eagers():
    x, t = logits(256, 1000, torch.bfloat16), targets(256, 1000)

    def loss(x, t):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return crossent.cross_entropy(x * 1, t)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    compiled, eager = torch.compile(loss, fullgraph=True)(a, t), loss(b, t)
    assert compiled.dtype == eager.dtype == torch.float32
    torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=0)  # the traced loss has no fused family
    compiled.backward(), eager.backward()
    assert a.grad.dtype == torch.bfloat16
    torch.testing.assert_close(a.grad, b.grad)
