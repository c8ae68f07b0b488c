"""vocab_parallel_cross_entropy and vocab_parallel_linear_cross_entropy: the vocabulary split across
ranks. Each test starts its ranks as
processes (torch.multiprocessing) that join one process group: gloo on the CPU and on one GPU (two
ranks sharing it: the kernels' path), NCCL on two GPUs (skipped, saying why, with fewer). Every
rank's loss, lse and slice of the gradient are checked against the loss of the gathered logits
(crossent.cross_entropy) in float64, with random incoming gradients: targets on the slices'
boundaries, all targets on one rank, the row's max on another rank than its target, uneven slices
(50257 over 2, an empty slice), every option, inplace, the DTensor entry, determinism, and the
collectives counted (one in the forward, none in the backward). The linear layer's: the loss, lse and
the gradients of the input (whole on every rank), the weight's and the bias's slices against
linear_cross_entropy's of the whole head in float64, over chunk boundaries, with its collectives
counted (a chunk's all-gather and its rows' all-reduce)."""
import importlib
import itertools
import os
import socket
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torch.nn.functional as F

import crossent
from crossent import parallel
from crossent.parallel import vocab_parallel_cross_entropy, vocab_parallel_linear_cross_entropy

OPTIONS = [dict(), dict(reduction="sum"), dict(reduction="none"), dict(ignore_index=3, reduction="sum"),
           dict(label_smoothing=0.2), dict(weight=True), dict(z_loss=1e-2), dict(softcap=3.0), dict(return_lse=True),
           dict(weight=True, label_smoothing=0.1, z_loss=1e-3, softcap=4.0, return_lse=True, reduction="none")]


def _spawn(case, world=2, backend="gloo", *args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(world, backend, port, case, args), nprocs=world)


def _rank(rank, world, backend, port, case, args):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world)
    globals()[case](rank, world, *args)
    dist.barrier()  # every rank done with the group's last work before any leaves
    # Past here a rank has passed. Leave without tearing the group down: gloo's teardown can deadlock
    # (torch 2.4: ~ProcessGroupGloo waits for a lock that a worker thread holds while it waits for the
    # GIL) or abort the process after the fact (torch 2.13: "terminate called without an active
    # exception", from a thread a device mesh leaves).
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(0)


def _slices(vocab, sizes):
    starts = [sum(sizes[:r]) for r in range(len(sizes))]
    assert sum(sizes) == vocab
    return list(zip(starts, sizes))


def _problem(rows, vocab, dtype, device, seed=0, ignore_index=-100):
    generator = torch.Generator().manual_seed(seed)  # the same on every rank
    full = (torch.randn(rows, vocab, generator=generator, dtype=torch.float64) * 3).to(dtype).to(device)
    t = torch.randint(0, vocab, (rows,), generator=generator)
    t[::4] = ignore_index
    return full, t.to(device)


def _kwargs(opts, vocab, dtype, device):
    kwargs = dict(opts)
    if kwargs.pop("weight", False):
        generator = torch.Generator().manual_seed(7)
        kwargs["weight"] = (torch.rand(vocab, generator=generator, dtype=torch.float64) + 0.5).to(dtype).to(device)
    return kwargs


def _check(rank, full, t, start, size, kwargs, dtype, tolerance, inplace=False, column_major=False):
    """This rank's loss, lse and gradient slice against the gathered logits' in float64 (column_major: the
    slice's columns contiguous, strides (1, N))."""
    shard = full[:, start:start + size].clone()
    if column_major:
        shard = shard.t().contiguous().t()
    leaf = shard.requires_grad_() if not inplace else shard.clone().requires_grad_()
    x = leaf if not inplace else leaf * 1  # inplace needs logits that are not a leaf
    got = vocab_parallel_cross_entropy(x, t, start, full.shape[1], inplace=inplace, **kwargs)
    ref_in = full.double().requires_grad_()
    kwargs64 = {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    want = crossent.cross_entropy(ref_in, t, **kwargs64)
    got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
    generator = torch.Generator().manual_seed(11)
    grads = [torch.rand(w.shape, generator=generator, dtype=torch.float64).to(w.device) for w in want]
    (dx,) = torch.autograd.grad(got, leaf, [g.to(o.dtype) for g, o in zip(grads, got)])
    (want_dx,) = torch.autograd.grad(want, ref_in, grads)
    for a, b, what in zip(got + (dx,), want + (want_dx[:, start:start + size],), ("loss", "lse", "dx")[-len(got) - 1:]):
        assert a.shape == b.shape, (rank, what, kwargs)
        scale = max(b[b.isfinite()].abs().max().item(), 1.0) if b.isfinite().any() else 1.0
        torch.testing.assert_close(a.double(), b, rtol=0, atol=tolerance * scale, equal_nan=True,
                                   msg=f"rank {rank} {what} {kwargs}")


# ------------------------------------------------------------------ the ranks' cases
def _case_every_option(rank, world, device, dtype, vocab, sizes):
    start, size = _slices(vocab, sizes)[rank]
    tolerance = 1e-12 if dtype == torch.float64 else 16 * torch.finfo(dtype).eps
    for opts, inplace in itertools.product(OPTIONS, (False, True)):
        if inplace and opts.get("return_lse"):
            continue
        full, t = _problem(13, vocab, dtype, device, ignore_index=opts.get("ignore_index", -100))
        t[1], t[2] = sizes[0], sizes[0] - 1  # on both sides of the first boundary
        _check(rank, full, t, start, size, _kwargs(opts, vocab, dtype, device), dtype, tolerance, inplace)


def _case_where_the_targets_and_maxima_lie(rank, world, device, dtype=torch.float64):
    """All targets on the last rank, every row's max on the first; and rows of -inf, NaN and 1e30."""
    vocab, sizes = 20, [8, 12]
    start, size = _slices(vocab, sizes)[rank]
    full, _ = _problem(6, vocab, dtype, device)
    full[:, 0] = 50.0
    t = torch.tensor([8, 19, 10, -100, 15, 9], device=device)
    tolerance = 1e-12 if dtype == torch.float64 else 16 * torch.finfo(dtype).eps
    for opts in (o for o in OPTIONS if "ignore_index" not in o):
        _check(rank, full, t, start, size, _kwargs(opts, vocab, dtype, device), dtype, tolerance)
    odd = full.clone()
    odd[0], odd[1, 3], odd[2, 9], odd[3] = -float("inf"), float("nan"), 1e30, -float("inf")
    odd[4, 10:] = -float("inf")  # the second slice of this row is all -inf
    loss = vocab_parallel_cross_entropy(odd[:, start:start + size], t, start, vocab, reduction="none")
    want = crossent.cross_entropy(odd, t, reduction="none")
    torch.testing.assert_close(loss, want, equal_nan=True)


def _case_collectives_and_bits(rank, world, device):
    """One all-gather in the forward, none in the backward; every rank's loss the same bits, run to run."""
    vocab, sizes = 50257, [25129, 25128]
    start, size = _slices(vocab, sizes)[rank]
    full, t = _problem(64, vocab, torch.float32, device)
    calls = []
    gather = parallel._all_gather
    parallel._all_gather = lambda *a, **k: calls.append(a) or gather(*a, **k)
    results = []
    for _ in range(2):
        x = full[:, start:start + size].clone().requires_grad_()
        loss = vocab_parallel_cross_entropy(x, t, start, vocab, label_smoothing=0.1)
        forward_calls = len(calls)
        loss.backward()
        assert (forward_calls, len(calls)) == (1, 1), calls
        calls.clear()
        results.append((loss.detach(), x.grad))
    parallel._all_gather = gather
    assert all(torch.equal(a, b) for a, b in zip(*results))
    everyone = [torch.zeros_like(results[0][0]) for _ in range(world)]
    dist.all_gather(everyone, results[0][0])
    assert all(torch.equal(everyone[0], other) for other in everyone)


def _case_dtensor(rank, world, device):
    """A DTensor sharded on the classes (torch.chunk's uneven shares of 11 over 2) gives the loss of the
    full logits, and its gradient the full logits' gradient, sharded."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = init_device_mesh(device.split(":")[0], (world,))
    full, t = _problem(9, 11, torch.float64, device)
    logits = distribute_tensor(full, mesh, [Shard(1)]).requires_grad_()
    loss = vocab_parallel_cross_entropy(logits, t, label_smoothing=0.1)
    loss.backward()
    ref = full.clone().requires_grad_()
    want = crossent.cross_entropy(ref, t, label_smoothing=0.1)
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=0)
    torch.testing.assert_close(logits.grad.full_tensor(), ref.grad, rtol=1e-12, atol=1e-15)
    with pytest.raises(RuntimeError, match="DTensor"):
        vocab_parallel_cross_entropy(logits * 1, t, inplace=True)
    replicated = distribute_tensor(t, mesh, [Replicate()])  # a DTensor target: as its local tensor
    assert torch.equal(vocab_parallel_cross_entropy(logits, replicated, label_smoothing=0.1), loss)
    with pytest.raises(RuntimeError, match="replicated"):
        vocab_parallel_cross_entropy(logits, distribute_tensor(t, mesh, [Shard(0)]))


def _case_no_rows_and_mistakes(rank, world, device):
    vocab, sizes = 10, [10, 0]  # the second rank's slice is empty
    start, size = _slices(vocab, sizes)[rank]
    full, t = _problem(0, vocab, torch.float64, device)
    for reduction in ("mean", "sum", "none"):
        x = full[:, start:start + size].clone().requires_grad_()
        loss = vocab_parallel_cross_entropy(x, t, start, vocab, reduction=reduction)
        want = crossent.cross_entropy(full, t, reduction=reduction)
        torch.testing.assert_close(loss, want, equal_nan=True)
    full, t = _problem(5, vocab, torch.float64, device)
    x = full[:, start:start + size].clone().requires_grad_()
    _check(rank, full, t, start, size, {}, torch.float64, 1e-12)
    with pytest.raises(RuntimeError, match="not within"):
        vocab_parallel_cross_entropy(x, t, start + 1, vocab)
    with pytest.raises(RuntimeError, match="class indices"):
        vocab_parallel_cross_entropy(x, t.double(), start, vocab)
    with pytest.raises(RuntimeError, match="all 10 classes"):
        vocab_parallel_cross_entropy(x, t, start, vocab, weight=torch.ones(3, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="leaf"):
        vocab_parallel_cross_entropy(x, t, start, vocab, inplace=True)
    with pytest.raises(RuntimeError, match="derivative for 'weight'"):
        vocab_parallel_cross_entropy(x, t, start, vocab, weight=torch.ones(vocab, dtype=torch.float64).requires_grad_())
    os.environ["CROSS_ENTROPY_CHECK_TARGETS"] = "1"  # every rank raises, none waits in the gather
    with pytest.raises(IndexError, match="outside"):
        vocab_parallel_cross_entropy(x, t.index_fill(0, torch.tensor([2]), vocab), start, vocab)
    del os.environ["CROSS_ENTROPY_CHECK_TARGETS"]


LINEAR_OPTIONS = OPTIONS + [dict(weight=True, label_smoothing=0.1, z_loss=1e-3, softcap=4.0)]


def _linear_problem(rows, dim, vocab, dtype, device, ignore_index=-100):
    """x (rows, dim), the whole head W (vocab, dim) and bias, targets: the same on every rank."""
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(rows, dim, generator=generator, dtype=torch.float64)
    w = torch.randn(vocab, dim, generator=generator, dtype=torch.float64) * 2 / dim**0.5
    b = torch.randn(vocab, generator=generator, dtype=torch.float64)
    t = torch.randint(0, vocab, (rows,), generator=generator)
    t[::4] = ignore_index
    return *(a.to(dtype).to(device) for a in (x, w, b)), t.to(device)


def _check_linear(rank, problem, start, size, kwargs, bias, chunk, tolerance):
    """This rank's loss, lse, input gradient and weight and bias slices against linear_cross_entropy's of
    the whole head in float64, for random incoming gradients of each output."""
    x, w, b, t = problem
    xs, ws = x.clone().requires_grad_(), w[start:start + size].clone().requires_grad_()
    bs = b[start:start + size].clone().requires_grad_() if bias else None
    got = vocab_parallel_linear_cross_entropy(xs, ws, t, start, w.shape[0], linear_bias=bs, chunk_size=chunk,
                                              **kwargs)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    b64 = b.double().requires_grad_() if bias else None
    kwargs64 = {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    want = crossent.cross_entropy(F.linear(x64, w64, b64), t, **kwargs64)
    got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
    generator = torch.Generator().manual_seed(11)
    grads = [torch.rand(o.shape, generator=generator, dtype=torch.float64).to(o.device) for o in want]
    params, params64 = [p for p in (xs, ws, bs) if p is not None], [p for p in (x64, w64, b64) if p is not None]
    got_grads = torch.autograd.grad(got, params, [g.to(o.dtype) for g, o in zip(grads, got)])
    want_grads = torch.autograd.grad(want, params64, grads)
    want_grads = [want_grads[0]] + [g[start:start + size] for g in want_grads[1:]]
    names = ("loss", "lse")[:len(got)] + ("dx", "dw", "db")[:len(got_grads)]
    for a, e, what in zip(got + got_grads, want + tuple(want_grads), names):
        assert a.shape == e.shape and (a.dtype == x.dtype or what in ("loss", "lse")), (rank, what, kwargs)
        scale = e[e.isfinite()].abs().max().item() if e.isfinite().any() else 0.0  # relative to its largest
        torch.testing.assert_close(a.double(), e, rtol=0, atol=tolerance * scale, equal_nan=True,
                                   msg=f"rank {rank} {what} {kwargs} bias={bias}")


def _case_linear_every_option(rank, world, device, dtype, vocab, sizes, chunk=5):
    """Every option, with and without a bias, 13 rows in chunks of `chunk` (the last one short), targets
    on both sides of the first slice's boundary."""
    start, size = _slices(vocab, sizes)[rank]
    tolerance = 1e-12 if dtype == torch.float64 else 16 * torch.finfo(dtype).eps
    for opts, bias in itertools.product(LINEAR_OPTIONS, (False, True)):
        problem = _linear_problem(13, 8, vocab, dtype, device, opts.get("ignore_index", -100))
        problem[3][1], problem[3][2] = sizes[0], sizes[0] - 1
        _check_linear(rank, problem, start, size, _kwargs(opts, vocab, dtype, device), bias, chunk, tolerance)


def _case_linear_collectives(rank, world, device):
    """A chunk's all-gather in the forward, and its rows' all-reduce of the input's gradient: in the
    forward where it writes the gradients, else in the backward, which gathers nothing. The same bits
    on every rank and run to run; an empty slice and no rows."""
    vocab, sizes = 50, [26, 24]
    start, size = _slices(vocab, sizes)[rank]
    x, w, b, t = _linear_problem(13, 8, vocab, torch.float32, device)
    gather, reduce = parallel._all_gather, dist.all_reduce
    calls = []
    parallel._all_gather = lambda *a, **k: calls.append("gather") or gather(*a, **k)
    dist.all_reduce = lambda *a, **k: calls.append("reduce") or reduce(*a, **k)
    results = []
    for reduction in ("mean", "mean", "none"):
        xs, ws = x.clone().requires_grad_(), w[start:start + size].clone().requires_grad_()
        loss = vocab_parallel_linear_cross_entropy(xs, ws, t, start, vocab, reduction=reduction, chunk_size=5)
        forward = list(calls)
        loss.sum().backward()
        backward = calls[len(forward):]
        calls.clear()
        chunks = 3  # 13 rows in chunks of 5
        fused = reduction == "mean"
        want = (["gather", "reduce"] * chunks, []) if fused else (["gather"] * chunks, ["reduce"] * chunks)
        assert (forward, backward) == want, (reduction, forward, backward)
        results.append((loss.detach(), xs.grad, ws.grad))
    parallel._all_gather, dist.all_reduce = gather, reduce
    assert all(torch.equal(a, b) for a, b in zip(results[0], results[1]))
    for tensor in results[0][:2]:  # the loss and the input's gradient: the same bits on every rank
        everyone = [torch.zeros_like(tensor) for _ in range(world)]
        dist.all_gather(everyone, tensor)
        assert all(torch.equal(everyone[0], other) for other in everyone)
    start, size = _slices(vocab, [vocab, 0])[rank]  # rank 1 holds no class
    _check_linear(rank, (x.double(), w.double(), b.double(), t), start, size, dict(label_smoothing=0.1), True, 4,
                  1e-12)
    x0, t0 = x[:0].double().requires_grad_(), t[:0]
    for reduction in ("mean", "sum", "none"):
        loss = vocab_parallel_linear_cross_entropy(x0, w[start:start + size].double(), t0, start, vocab,
                                                   reduction=reduction)
        torch.testing.assert_close(loss, crossent.cross_entropy(x0.new_empty(0, vocab), t0, reduction=reduction),
                                   equal_nan=True)


# ------------------------------------------------------------------ on the CPU: gloo
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_every_option_over_two_ranks_is_the_gathered_loss(dtype):
    _spawn("_case_every_option", 2, "gloo", "cpu", dtype, 50, [26, 24])


def test_every_option_over_three_uneven_ranks():
    _spawn("_case_every_option", 3, "gloo", "cpu", torch.float64, 23, [10, 1, 12])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_where_the_targets_and_maxima_lie(dtype):
    _spawn("_case_where_the_targets_and_maxima_lie", 2, "gloo", "cpu", dtype)


def test_one_collective_and_the_same_bits():
    _spawn("_case_collectives_and_bits", 2, "gloo", "cpu")


def _public_dtensor():
    return hasattr(importlib.import_module("torch.distributed.tensor"), "distribute_tensor")


@pytest.mark.skipif(not _public_dtensor(), reason="torch.distributed.tensor has no DTensor API before torch 2.5")
def test_a_dtensor_sharded_on_the_classes():
    _spawn("_case_dtensor", 2, "gloo", "cpu")


def test_no_rows_an_empty_slice_and_mistakes():
    _spawn("_case_no_rows_and_mistakes", 2, "gloo", "cpu")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_linear_layers_slices_over_two_ranks(dtype):
    _spawn("_case_linear_every_option", 2, "gloo", "cpu", dtype, 50, [26, 24])


def test_a_linear_layers_slices_over_three_uneven_ranks():
    _spawn("_case_linear_every_option", 3, "gloo", "cpu", torch.float64, 23, [10, 1, 12])


def test_a_linear_layers_collectives_and_bits():
    _spawn("_case_linear_collectives", 2, "gloo", "cpu")


def test_it_needs_torch_distributed():
    with pytest.raises(RuntimeError, match="initialize torch.distributed"):
        vocab_parallel_cross_entropy(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), 0, 3)


# ------------------------------------------------------------------ on one GPU: the kernels, over gloo
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_kernels_over_two_ranks_on_one_gpu():
    _spawn("_case_kernels_on_one_gpu", 2, "gloo")  # one pair of ranks for the dtypes: each loads the kernels once


def _case_kernels_on_one_gpu(rank, world):
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        _case_kernels_in(rank, world, dtype)


def _case_kernels_in(rank, world, dtype):
    """Two ranks on one GPU: every option, where the targets and maxima lie, a target outside [0, V) (its
    row NaN) and column-major logits, by the kernels' path (its gradients counted), the two numbers a
    row gathered through the host, as gloo moves them."""
    gather, backward, merge = parallel._all_gather, parallel.cross_entropy_backward, parallel.split_merge
    launches, merges = [], []

    def through_host(out, local, group=None):
        host = torch.empty(out.shape, dtype=out.dtype)
        gather(host, local.cpu(), group=group)
        out.copy_(host)

    parallel._all_gather = through_host
    parallel.cross_entropy_backward = lambda *a, **k: launches.append(k["split"]) or backward(*a, **k)
    parallel.split_merge = lambda *a: merges.append(a[2:4]) or merge(*a)
    vocab, sizes = 50257, [25129, 25128]
    _case_every_option(rank, world, "cuda:0", dtype, vocab, sizes)
    start, size = _slices(vocab, sizes)[rank]
    tolerance = 16 * torch.finfo(dtype).eps
    full, t = _problem(13, vocab, dtype, "cuda:0")
    _check(rank, full, t, start, size, dict(label_smoothing=0.1), dtype, tolerance, column_major=True)
    bad = t.index_fill(0, torch.tensor([5], device=t.device), vocab)  # row 5's loss and gradient NaN, and no other's
    runs = []
    for target in (t, bad):
        x = full[:, start:start + size].clone().requires_grad_()
        loss = vocab_parallel_cross_entropy(x, target, start, vocab, reduction="none", label_smoothing=0.1)
        loss.backward(torch.ones_like(loss))
        runs.append((loss.detach(), x.grad))
    (loss, dx), (loss_bad, dx_bad) = runs
    others = torch.arange(13, device=t.device) != 5
    assert loss_bad[5].isnan() and dx_bad[5].isnan().all(), (loss_bad[5], dx_bad[5])
    assert torch.equal(loss_bad[others], loss[others]) and torch.equal(dx_bad[others], dx[others])
    assert set(launches) == {(25129 * rank, 50257)} and set(merges) == {(50257, 2)}
    start, size = _slices(vocab, [vocab, 0])[rank]  # rank 1 holds no class, and merges as rank 0 does
    _check(rank, full, t, start, size, dict(reduction="none", return_lse=True), dtype, tolerance)
    if dtype == torch.float32:
        _case_where_the_targets_and_maxima_lie(rank, world, "cuda:0", dtype)
    parallel._all_gather, parallel.cross_entropy_backward, parallel.split_merge = gather, backward, merge


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_linear_layers_kernels_over_two_ranks_on_one_gpu():
    _spawn("_case_linear_kernels_on_one_gpu", 2, "gloo")


def _case_linear_kernels_on_one_gpu(rank, world):
    """Two ranks on one GPU, the kernels' path for each chunk (50257 classes over 2), every option, in
    each dtype; the gather and the all-reduce through the host, as gloo moves them."""
    gather, reduce = parallel._all_gather, dist.all_reduce

    def gather_through_host(out, local, group=None):
        host = torch.empty(out.shape, dtype=out.dtype)
        gather(host, local.cpu(), group=group)
        out.copy_(host)

    def reduce_through_host(tensor, group=None, async_op=False):
        host = tensor.cpu()
        reduce(host, group=group)
        tensor.copy_(host)
        done = torch.futures.Future()  # a work already done: its wait returns at once
        done.set_result(tensor)
        return done

    parallel._all_gather, dist.all_reduce = gather_through_host, reduce_through_host
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        _case_linear_every_option(rank, world, "cuda:0", dtype, 50257, [25129, 25128], chunk=6)
    start, size = _slices(50257, [50257, 0])[rank]  # rank 1 holds no class: its slice's launches take none
    problem = _linear_problem(13, 8, 50257, torch.bfloat16, "cuda:0")
    _check_linear(rank, problem, start, size, dict(label_smoothing=0.1), True, 6, 16 * torch.finfo(torch.bfloat16).eps)
    parallel._all_gather, dist.all_reduce = gather, reduce


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_kernels_step_is_four_launches_and_the_gather():
    _spawn("_case_launches_on_one_gpu", 1, "nccl")


def _case_launches_on_one_gpu(rank, world):
    """A step by the kernels, on one rank: the forward's row state, the terms, the merge and the
    gradient, with the all-gather and the incoming gradient's fill beside them; none of the rows'
    operations that PyTorch's path takes."""
    from torch.profiler import ProfilerActivity, profile
    vocab = 1000
    full, t = _problem(64, vocab, torch.bfloat16, "cuda:0")
    x = full.clone().requires_grad_()
    weight = _kwargs(dict(weight=True), vocab, torch.bfloat16, "cuda:0")["weight"]
    vocab_parallel_cross_entropy(x, t, 0, vocab).backward()  # the communicator and the builds, outside the profile
    for kwargs in (dict(), dict(weight=weight, reduction="sum", z_loss=1e-3, softcap=3.0)):
        x.grad = None
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            vocab_parallel_cross_entropy(x, t, 0, vocab, **kwargs).backward()
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        ours = [name for name in names if "cross_entropy" in name]
        others = [name for name in names if "cross_entropy" not in name and not name.startswith("Memcpy")]
        assert len(ours) == 4 and len(others) <= 2, (kwargs.keys(), ours, others)


# ------------------------------------------------------------------ on two GPUs: NCCL
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs for NCCL")


@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_option_over_two_gpus(dtype):
    _spawn("_case_every_option_on_gpu", 2, "nccl", dtype)


def _case_every_option_on_gpu(rank, world, dtype):
    _case_every_option(rank, world, f"cuda:{rank}", dtype, 50257, [25129, 25128])


@pytest.mark.gpu
@two_gpus
def test_a_linear_layers_slices_over_two_gpus():
    _spawn("_case_linear_on_two_gpus", 2, "nccl")


def _case_linear_on_two_gpus(rank, world):
    """NCCL's all-gathers and its all-reduces, begun beside the dW matmuls and waited on after them."""
    for dtype in (torch.float32, torch.bfloat16):
        _case_linear_every_option(rank, world, f"cuda:{rank}", dtype, 50257, [25129, 25128], chunk=6)
    _case_linear_collectives(rank, world, f"cuda:{rank}")


@pytest.mark.gpu
@two_gpus
def test_one_collective_and_the_same_bits_over_two_gpus():
    _spawn("_case_collectives_on_gpu", 2, "nccl")


def _case_collectives_on_gpu(rank, world):
    """No host synchronization in a step; and by the profiler, one NCCL kernel, an all-gather, in a
    forward and backward."""
    from torch.profiler import ProfilerActivity, profile
    device = f"cuda:{rank}"
    vocab, sizes = 50257, [25129, 25128]
    start, size = _slices(vocab, sizes)[rank]
    full, t = _problem(256, vocab, torch.bfloat16, device)
    x = full[:, start:start + size].clone().requires_grad_()
    vocab_parallel_cross_entropy(x, t, start, vocab).backward()  # NCCL's communicator, outside the profile
    torch.cuda.set_sync_debug_mode("error")  # a step that waits on the GPU raises
    try:
        vocab_parallel_cross_entropy(x, t, start, vocab, label_smoothing=0.1, weight=torch.ones(vocab, device=device,
                                     dtype=torch.bfloat16)).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        vocab_parallel_cross_entropy(x, t, start, vocab, label_smoothing=0.1).backward()
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    nccl = [name for name in kernels if name.lower().startswith("nccl")]
    assert len(nccl) == 1 and "allgather" in nccl[0].lower(), nccl
    _case_collectives_and_bits(rank, world, device)
    _case_where_the_targets_and_maxima_lie(rank, world, device)
    if _public_dtensor():
        _case_dtensor(rank, world, device)
