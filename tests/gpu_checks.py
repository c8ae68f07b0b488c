"""What the GPU tests share: the check against float64, the plan and kernel a call takes, and
inputs shaped to catch a misplaced target logit or special value."""
import re

import torch

from cases import expected_loss

# float32 logits: 1e-5 relative; 16-bit results carry their dtype's rounding.
RTOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}


def assert_matches(out, x, t):
    assert out.shape == () and out.dtype == x.dtype and out.device == x.device
    ref = expected_loss(x, t)
    if torch.isnan(ref):
        assert torch.isnan(out)
        return
    got = out.double()
    assert torch.isfinite(got), (got, ref)
    assert abs(got - ref) <= RTOL[x.dtype] * abs(ref) + 1e-6, (got.item(), ref.item())


def plan_for(x):
    """The plan the dispatch takes for 2-D logits x."""
    from crossent.dispatch import plan_on
    rows, cols = x.shape
    return plan_on(x.get_device(), rows, cols, x.stride(0), x.element_size(), x.data_ptr() % 16)


def launched_kernel(fn):
    """The one kernel fn launches: (family, its template arguments by name), from its demangled name."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA], acc_events=True) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if re.search(r"cross_entropy_\w+_kernel", e.name)]
    assert len(names) == 1, names
    name = names[0]
    family = re.search(r"cross_entropy_(\w+?)_kernel", name).group(1)
    args = name[name.index("<") + 1:name.rindex(">")].split(", ")
    params = {"rows": ("E", "Target", "evict_first", "lead_256"), "tiles": ("E", "Target", "sweeps", "evict_first"),
              "row_batches": ("E", "batch_rows", "evict_first"), "one_row": ("E",), "streamed": ("E", "P", "kStrided")}[family]
    assert len(args) == len(params), name
    return family, dict(zip(params, args))


def spiked(x, t, peak=30.0):
    """x, in place: standard normal logits, each row's target column `peak` above them, so a row's
    loss is about 0 where the target logit is read right and about `peak` where any other is."""
    x.copy_(torch.randn(x.shape, device=x.device))
    x[torch.arange(x.shape[0], device=x.device), t] = peak
    return x


def spread_columns(rows, cols):
    """A target column per row: each column once where rows allow, else both ends of the row and
    a spread between them."""
    if rows >= cols:
        return torch.arange(rows, device="cuda") % cols
    ends = torch.cat([torch.arange(32), cols - 32 + torch.arange(32)])
    return torch.cat([ends, (torch.arange(rows - 64) * 7919) % cols]).cuda()


def special_rows(cols):
    x = torch.randn(8, cols, device="cuda")
    t = torch.arange(8, device="cuda")
    x[1, :] = float("-inf")          # all -inf: NaN
    x[2, 2] = float("-inf")          # -inf at the target: +inf
    x[3, 10:20] = float("-inf")      # -inf elsewhere: finite
    x[4, 7] = float("inf")           # +inf: NaN
    x[5, 9] = float("nan")           # NaN: NaN
    return x, t
