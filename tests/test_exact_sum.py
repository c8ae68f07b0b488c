"""The exact sum: the device code alone against math.fsum, and the kernels' use of it, the same
bits in any schedule, the accumulator left at zero after every launch."""
import math

import pytest
import torch

import crossent
from cases import logits, targets
from crossent import build, dispatch
from crossent.constants import EXACT_WORDS
from crossent.params import workspace_layout
from gpu_checks import assert_matches, plan_for

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("rows, cols, dtype", [(4097, 4096, torch.float32), (4001, 4096, torch.bfloat16),
                                               (3000, 1000, torch.float32), (300, 5000, torch.float16)])
def test_exact_sum_is_the_same_in_any_schedule(model, monkeypatch, policy, rows, cols, dtype):
    """Chunks add their losses to the exact sum in whatever order CTAs finish them; any grid, so any
    schedule, must give the same bits, and every launch must leave the counters and the exact sum at
    zero for the next; the weighted mean's two exact sums too. Row batches (fp32 and bf16), tiles of
    short rows, rows in registers."""
    monkeypatch.setattr(dispatch, "_workspaces", {})  # its own buffer, which is inspected
    x, t = logits(rows, cols, dtype), targets(rows, cols)
    t[::5] = -100
    plan = plan_for(x)
    first = model(x, t)
    assert_matches(first, x, t)
    ws = dispatch._workspaces[(0, torch.cuda.current_stream().cuda_stream)]
    w = (torch.rand(cols, device="cuda") + 0.1).to(dtype)
    first_weighted = crossent.cross_entropy(x, t, w)
    exact_off, weight_off, _, _, _ = workspace_layout(plan.splits, rows)
    used = (weight_off + 8 * EXACT_WORDS) // 4
    for grid in (2, 3, 37, plan.grid // 2, plan.grid):
        # the problem's plan (dispatch.plan_rows'): the fixture forgets the problems kept, so the next call plans
        policy("plan_rows", lambda *_, **__: plan._replace(grid=grid))
        for _ in range(2):
            assert torch.equal(model(x, t), first), grid
            assert not ws[:used].any()
            assert torch.equal(crossent.cross_entropy(x, t, w), first_weighted), grid
            assert not ws[:used].any()


# The exact sum's device code alone (common/exact_sum.cuh, after arch.cuh and the constants it
# uses), with a kernel that adds values in the order given and one thread that reads the sum back.
_EXACT_SUM_TEST_SRC = r"""
{source}
__global__ void add_all(const float* v, long long n, unsigned long long* acc) {{
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) exact_add(acc, v[i]);
}}
__global__ void read_sum(unsigned long long* acc, double* out) {{ *out = exact_sum(acc); }}
void exact_sum_of(uintptr_t v, int64_t n, uintptr_t acc, uintptr_t out) {{
  if (n > 0) add_all<<<int((n + 255) / 256), 256>>>(reinterpret_cast<const float*>(v), n, reinterpret_cast<unsigned long long*>(acc));
  read_sum<<<1, 1>>>(reinterpret_cast<unsigned long long*>(acc), reinterpret_cast<double*>(out));
}}
"""


@pytest.fixture(scope="module")
def exact_sum_of():
    from torch.utils.cpp_extension import load_inline
    source = build.assemble(["common/arch.cuh", "common/exact_sum.cuh"])
    ext = load_inline(name="crossent_exact_sum_test", cpp_sources=[
        "#include <pybind11/pybind11.h>\n#include <cstdint>\nvoid exact_sum_of(uintptr_t, int64_t, uintptr_t, uintptr_t);\n"
        "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"exact_sum_of\", &exact_sum_of); }"],
        cuda_sources=[_EXACT_SUM_TEST_SRC.format(source=source)], extra_cuda_cflags=["-O3"], **build._build_options())
    acc = torch.zeros(EXACT_WORDS, dtype=torch.int64, device="cuda")

    def run(values):
        v = torch.tensor(values, dtype=torch.float32, device="cuda")
        out = torch.empty((), dtype=torch.float64, device="cuda")
        ext.exact_sum_of(v.data_ptr(), v.numel(), acc.data_ptr(), out.data_ptr())
        got = out.item()
        assert not acc.any()  # left at zero
        return got, v.tolist()  # the values as floats rounded them
    return run


def test_exact_sum_is_exact(exact_sum_of):
    """The accumulator against math.fsum, over every float exponent, signs, subnormals and
    cancellation that a float or double sum in the order given would get wrong."""
    big, tiny = 3.0e38, 1.0e-45  # near the largest float, and the smallest subnormal
    cases = [
        [],
        [0.0, -0.0],
        [big, 1.0, -big],                  # 1.0: a float or double sum in this order gives 0
        [tiny, big, -big, tiny],           # two subnormals around the largest floats
        [big] * 1000,                      # carries past the top digit
        [-big] * 1000 + [tiny],
        [1.0, -tiny],                      # a negative total's digits: 1 - 2^-149
        [-1.0, tiny],
        [2.0**k for k in range(-149, 128)] + [-(2.0**k) for k in range(-149, 128, 3)],
    ]
    gen = torch.Generator().manual_seed(7)
    for low, high in [(-140, 120), (-20, 20), (-160, -100)]:  # random signs and exponents, subnormals among them
        exponents = torch.randint(low, high, (100000,), generator=gen).double()
        cases.append((torch.randn(100000, generator=gen, dtype=torch.float64) * 2.0**exponents).float().tolist())
    for values in cases:
        got, floats = exact_sum_of(values)
        exact = math.fsum(floats)  # the exact sum, rounded once
        assert abs(got - exact) <= 4e-16 * abs(exact), (got, exact, len(values))
    inf, nan = float("inf"), float("nan")  # IEEE rules
    assert exact_sum_of([1.0, inf, 2.0])[0] == inf
    assert exact_sum_of([-inf, 1.0])[0] == -inf
    got = [exact_sum_of(v)[0] for v in ([inf, -inf], [1.0, nan], [nan, inf])]
    assert all(s != s for s in got)  # NaN
