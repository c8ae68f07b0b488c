"""The contract, whichever kernel family takes a problem: ModelNew against float64 on fresh random
inputs in every dtype, target type, view and kind of load; special values, ignore_index, bad
targets and bad inputs as PyTorch has them; determinism, no result cached (a problem's plan kept),
graphs and streams; and the tools (run_eval, compute-sanitizer) end to end."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import crossent
from crossent import build, constants, dispatch
from crossent import policy as launch_policy

from cases import DTYPES, PATHS, SHAPES, logits, targets, views
from conftest import ROOT
from gpu_checks import RTOL, assert_matches, launched_kernel, plan_for, special_rows

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("tdtype", [torch.int64, torch.int32], ids=["int64", "int32"])
@pytest.mark.parametrize("rows, cols", SHAPES, ids=[f"{r}x{c}" for r, c in SHAPES])
def test_matches_float64(model, rows, cols, dtype, tdtype):
    x, t = logits(rows, cols, dtype), targets(rows, cols, tdtype)
    assert_matches(model(x, t), x, t)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("rows, cols", [(300, 1000), (3000, 10), (64, 4099), (5, 33), (16, 256000)])
def test_views(model, rows, cols, dtype):
    t = targets(rows, cols)
    for name, x in views(rows, cols, dtype):
        assert_matches(model(x, t), x, t)


# Every kernel instance, under either kind of load: the host picks one by the logits' size, so
# each test forces it. "tiled-long" has rows long enough for evict-first tiles at fewer CTAs per SM.
INSTANCE_CASES = {"tiled": PATHS["tiled"], "tiled-short": PATHS["tiled short"],
                  "tiled-short-thread": PATHS["tiled short, thread per row"],
                  "tiled-short-thread-odd": PATHS["tiled short, thread per row, odd width"], "tiled-long": (300, 1000),
                  "registers": PATHS["registers"], "split": (16, 256000), "unaligned": (257, 4099),
                  "row-batches": PATHS["row batches"], "one-row": PATHS["one row"]}


@pytest.mark.parametrize("evict_first", [True, False], ids=["evict-first", "plain"])
@pytest.mark.parametrize("tdtype", [torch.int64, torch.int32], ids=["int64", "int32"])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("case", INSTANCE_CASES)
def test_every_instance_under_both_kinds_of_load(model, policy, case, dtype, tdtype, evict_first):
    """The launch takes the instance the plan names: its family, its compile-time choice (tiles'
    sweeps, row batches' rows, whether rows take the 256-byte lead) and its kind of load."""
    policy("_evict_first", lambda *_: evict_first)
    rows, cols = INSTANCE_CASES[case]
    x, t = logits(rows, cols, dtype), targets(rows, cols, tdtype)
    p = plan_for(x)
    out = []
    family, args = launched_kernel(lambda: out.append(model(x, t)))
    names = {constants.ROWS: "rows", constants.TILES: "tiles", constants.ROW_BATCHES: "row_batches",
             constants.ONE_ROW: "one_row"}
    assert family == names[p.family], (family, p)
    assert args.get("evict_first", str(evict_first).lower()) == str(evict_first).lower(), args
    if family == "rows":  # evict-first rows that take no lead (_lead_256) have an instance of their own
        assert args["lead_256"] == str(p.lead_256 or not evict_first).lower(), (args, p)
    if family == "tiles":
        assert args["sweeps"] == str(p.sweeps), (args, p)
    if family == "row_batches":
        assert args["batch_rows"] == str(p.batch_rows), (args, p)
    assert_matches(out[0], x, t)


def test_the_memory_regime_of_a_known_gpu():
    """The H100 keeps the rules it was measured with; the H200's memory is fast (policy._fast_memory)."""
    name = torch.cuda.get_device_name(0)
    if not any(k in name for k in ("H100", "H200")):
        pytest.skip(f"{name}: not a GPU this policy was measured on")
    gpu = build.device_gpu(0)
    assert launch_policy._fast_memory(gpu) == ("H200" in name), (name, gpu)


def test_load_kind_follows_the_logits_size(model):
    gpu = build.device_gpu(0)
    l2 = gpu.l2_bytes
    if launch_policy._fast_memory(gpu):
        # Memory faster than the row-batch kernel's bytes in flight (the H200): row batches up to
        # _FAST_MEMORY_L2S L2 sizes of logits, rows in registers past them; fp32 evict-first up to
        # that size too, 16-bit up to _EVICT_FIRST_L2S.
        limit = launch_policy._FAST_MEMORY_L2S * l2
        cases = [(limit // (4096 * 4), 4096, torch.float32, True, True),
                 (limit // (4096 * 4) + 1, 4096, torch.float32, False, False),
                 (limit // (4104 * 2) + 1, 4104, torch.bfloat16, False, True),
                 (limit // (4096 * 2) + 2, 4096, torch.bfloat16, False, True),
                 (launch_policy._EVICT_FIRST_L2S * l2 // (4096 * 2) + 2, 4096, torch.bfloat16, False, False)]
    else:
        # Up to _EVICT_FIRST_L2S L2 sizes of logits read evict-first, one row more plainly; but 16-bit
        # rows in the row-batch kernel read evict-first at any size.
        limit = launch_policy._EVICT_FIRST_L2S * l2
        cases = [(limit // (4096 * 4), 4096, torch.float32, True, True),
                 (limit // (4096 * 4) + 1, 4096, torch.float32, True, False),
                 (limit // (4104 * 2) + 1, 4104, torch.bfloat16, False, False),
                 (limit // (4096 * 2) + 2, 4096, torch.bfloat16, True, True)]
    for n, cols, dtype, row_batches, expected in cases:
        x, t = logits(n, cols, dtype), targets(n, cols)
        family, args = launched_kernel(lambda: model(x, t))
        assert (family == "row_batches") == row_batches, family
        assert args["evict_first"] == str(expected).lower(), (n, cols, dtype)


@pytest.mark.parametrize("path", PATHS)
def test_huge_magnitudes_do_not_overflow(model, path):
    x = torch.randn(*PATHS[path], device="cuda") * 1e30
    t = targets(*PATHS[path])
    assert_matches(model(x, t), x, t)
    same = torch.full((4, 4096), 1e30, device="cuda")  # every class equal: loss log(C), exactly
    out = model(same, targets(4, 4096))
    assert abs(out.item() - torch.log(torch.tensor(4096.0)).item()) < 1e-5


@pytest.mark.parametrize("near", [3e4, 1e6, 4e6], ids=["3e4", "1e6", "4e6"])
@pytest.mark.parametrize("path", PATHS)
def test_large_shared_max(model, path, near):
    """Every row's max is the same large value, whose product with log2(e) rounds as far as any
    near it in float32. Short rows compute exp(x - max) as exp2(x * log2(e) - c) with c that rounded
    product: the rounding shifts every row's loss alike (by 1.3e-3 near 3e4, about 20 times the
    tolerance) unless the kernel corrects for it. Past 2^20 (4e6) the kernel does not fold."""
    rows, cols = PATHS[path]
    log2e = torch.tensor(1.4426950408889634, dtype=torch.float32)
    start = torch.tensor(near, dtype=torch.float32)
    ulp = torch.nextafter(start, torch.tensor(float("inf"))) - start
    candidates = start + torch.arange(256, dtype=torch.float32) * ulp
    rounding = ((candidates * log2e).double() - candidates.double() * log2e.double()).abs()
    top = candidates[int(rounding.argmax())].item()
    x = top - 10 * torch.rand(rows, cols, device="cuda")
    x[:, 0] = top
    t = targets(rows, cols)
    assert_matches(model(x, t), x, t)


@pytest.mark.parametrize("cols", [12, 64, 5000], ids=["tiled-short", "tiled", "registers"])
def test_special_rows_poison_the_mean_like_pytorch(model, cols):
    x, t = special_rows(cols)
    for rows in ([0, 3], [0, 2], [0, 1], [0, 4], [0, 5]):
        expected = torch.nn.functional.cross_entropy(x[rows], t[rows])
        torch.testing.assert_close(model(x[rows], t[rows]), expected, equal_nan=True, rtol=1e-5, atol=0)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("path", PATHS)
def test_ignore_index(model, path, dtype):
    x, t = logits(*PATHS[path], dtype), targets(*PATHS[path])
    t[1::3] = -100  # a third of the rows; none of a lone row
    assert_matches(model(x, t), x, t)
    expected = torch.nn.functional.cross_entropy(x.float(), t)
    torch.testing.assert_close(model(x, t).float(), expected, rtol=RTOL[dtype], atol=0)
    t[:] = -100
    assert torch.isnan(model(x, t))  # nothing counted: 0/0, as PyTorch gives


@pytest.mark.parametrize("rows, cols", [(1, 77), (1, 4096), (0, 77), (2, 4096)])
def test_ignore_index_where_the_grid_is_one_cta(model, policy, rows, cols):
    """One row has its own kernel; no rows, or two rows planned for a GPU of one SM, give the general
    kernel a grid of one CTA. Every row ignored: NaN (0 / 0), as PyTorch gives."""
    one_sm = build.device_gpu(torch.cuda.current_device())._replace(sms=1)
    policy("device_gpu", lambda _: one_sm)
    x, t = logits(rows, cols, torch.float32), targets(rows, cols)
    p = plan_for(x)
    assert p.grid == 1 and (p.family == constants.ONE_ROW) == (rows == 1)
    assert_matches(model(x, t), x, t)
    t[:] = -100
    assert torch.isnan(model(x, t))
    if rows == 2:
        t[1] = 5
        assert_matches(model(x, t), x, t)


@pytest.mark.parametrize("bad", ["-1", "cols", "10**12", "-101"])
@pytest.mark.parametrize("rows, cols", [(1000, 77), (64, 5000), (4, 300000)])
def test_out_of_range_target_gives_nan(model, bad, rows, cols):
    x, t = logits(rows, cols, torch.float32), targets(rows, cols)
    t[rows // 2] = eval(bad, {"cols": cols})
    assert torch.isnan(model(x, t))


def test_opt_in_target_check_names_the_row():
    checked = crossent.ModelNew(check_targets=True)
    x, t = logits(1000, 77, torch.float32), targets(1000, 77)
    t[::5] = -100
    assert_matches(checked(x, t), x, t)
    t[123], t[456] = 77, -3
    with pytest.raises(IndexError, match=r"targets\[123\] = 77 is outside \[0, 77\)"):
        checked(x, t)


def test_opt_in_check_from_environment(monkeypatch):
    monkeypatch.setenv("CROSS_ENTROPY_CHECK_TARGETS", "1")
    assert crossent.ModelNew().check_targets
    monkeypatch.setenv("CROSS_ENTROPY_CHECK_TARGETS", "0")
    assert not crossent.ModelNew().check_targets


def test_unbatched_input(model):
    x, t = logits(1, 1000, torch.float32)[0], torch.tensor(17, device="cuda")
    torch.testing.assert_close(model(x, t), torch.nn.functional.cross_entropy(x, t), rtol=1e-5, atol=0)


def test_empty_batch_gives_nan(model):
    for dtype in DTYPES.values():
        out = model(torch.empty(0, 10, device="cuda", dtype=dtype), torch.empty(0, dtype=torch.long, device="cuda"))
        assert out.shape == () and out.dtype == dtype and torch.isnan(out)


@pytest.mark.parametrize("rows, cols, dtype", [(524416, 4096, torch.bfloat16),   # N*C = 2^31 + 2^16
                                               (2147500, 1000, torch.bfloat16),  # the same in tiles
                                               (1, 2**31 + 9, torch.float16)])   # one row past 2^31
def test_more_than_2_31_elements(model, rows, cols, dtype):
    if torch.cuda.get_device_properties(0).total_memory < 24 * 2**30:
        pytest.skip("needs 24 GiB of GPU memory")
    x = torch.empty(rows, cols, device="cuda", dtype=dtype)
    x.normal_(0, 2)
    t = targets(rows, cols)
    t[-1] = cols - 1  # the last element of the tensor matters
    assert_matches(model(x, t), x, t)
    del x


def test_strided_targets(model):
    x = logits(100, 50, torch.float32)
    t = targets(200, 50)[::2]
    assert_matches(model(x, t), x, t)


def test_kernelbench_inputs(model):
    x, t = torch.rand(32768, 4096, device="cuda"), targets(32768, 4096)
    assert_matches(model(x, t), x, t)


@pytest.mark.parametrize("rows, cols", [(32768, 4096), (16, 256000), (4096, 129)])
def test_bitwise_deterministic(model, rows, cols):
    x, t = logits(rows, cols, torch.float32), targets(rows, cols)
    first = model(x, t)
    for _ in range(19):
        assert torch.equal(model(x, t), first)


def test_no_result_is_cached(model):
    x, t = logits(4096, 1000, torch.float32), targets(4096, 1000)
    a = model(x, t).item()
    x[7, t[7]] -= 50.0  # same tensor, new values
    b = model(x, t).item()
    assert b > a and abs((b - a) - 50.0 / 4096) < 1e-3


def test_a_problem_is_worked_out_once(policy):
    """A problem's first call checks the tensors, lays them out and plans; its later calls, whatever
    their data (the class weights' values included), launch with no plan, and give the bits a call that
    works the problem out anew gives. A change that a check, the layout or the plan reads is another
    problem; logits the kernels cannot read in place are laid out anew at every call."""
    planned = []
    plan_rows = dispatch.plan_rows
    policy("plan_rows", lambda *args, **kwargs: planned.append(args[0].rows) or plan_rows(*args, **kwargs))

    def plans(fn):  # (plans made, result, the result of a call that works the problem out anew)
        before = len(planned)
        got = fn()
        made = len(planned) - before
        dispatch.forget_problems()
        return made, got, fn()

    x, t = logits(300, 1000, torch.bfloat16), targets(300, 1000)
    w = (torch.rand(1000, device="cuda") + 0.1).to(torch.bfloat16)
    assert plans(lambda: crossent.cross_entropy(x, t, w, label_smoothing=0.1))[0] == 1
    for _ in range(3):
        x, t, w = logits(300, 1000, torch.bfloat16), targets(300, 1000), torch.rand_like(w) + 0.1
        made, got, anew = plans(lambda: crossent.cross_entropy(x, t, w, label_smoothing=0.1))
        assert made == 0 and torch.equal(got, anew)
    flat = logits(1, 300 * 1000 + 8, torch.bfloat16)[0]
    others = [lambda: crossent.cross_entropy(x.float(), t), lambda: crossent.cross_entropy(x[:299], t[:299]),
              lambda: crossent.cross_entropy(x[:, :999], t % 999), lambda: crossent.cross_entropy(x, t.int()),
              lambda: crossent.cross_entropy(flat[1:300001].view(300, 1000), t),  # off the 16-byte grid
              lambda: crossent.cross_entropy(x, t, reduction="none"), lambda: crossent.cross_entropy(x, t, w),
              lambda: crossent.cross_entropy(x, t, z_loss=1e-4), lambda: crossent.cross_entropy(x.requires_grad_(), t)]
    for fn in others:
        made, got, anew = plans(fn)
        assert made == 1 and torch.equal(got, anew)
        made, again, _ = plans(fn)
        assert made == 0 and torch.equal(again, got)
    columns = logits(1000, 300, torch.bfloat16).T  # its classes not adjacent: copied, at every call
    assert [plans(lambda: crossent.cross_entropy(columns, t))[0] for _ in range(2)] == [1, 1]


def test_inputs_are_not_modified(model):
    for rows, cols in [(32768, 4096), (16, 256000), (33, 129)]:
        x, t = logits(rows, cols, torch.float32), targets(rows, cols)
        x0, t0 = x.clone(), t.clone()
        model(x, t)
        torch.cuda.synchronize()
        assert torch.equal(x, x0) and torch.equal(t, t0)


@pytest.mark.parametrize("rows, cols", [(4096, 4096), (8, 300000)])
@pytest.mark.parametrize("warm", [True, False], ids=["warmed", "first-call-in-capture"])
def test_cuda_graph_capture(model, rows, cols, warm):
    x, t = logits(rows, cols, torch.float32), targets(rows, cols)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        if warm:
            model(x, t)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            out = model(x, t)
    torch.cuda.current_stream().wait_stream(side)
    for _ in range(3):
        x.copy_(logits(rows, cols, torch.float32))
        t.copy_(targets(rows, cols))
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(out, x, t)
        assert torch.equal(out, model(x, t))


def test_side_streams(model):
    xs = [logits(2048, 4096, torch.float32) for _ in range(2)]
    ts = [targets(2048, 4096) for _ in range(2)]
    expected = [model(x, t) for x, t in zip(xs, ts)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    outs = []
    for _ in range(10):  # both streams in flight at once, each with its own workspace
        for s, x, t in zip(streams, xs, ts):
            with torch.cuda.stream(s):
                assert dispatch.current_stream(0) == s.cuda_stream  # the launch's stream
                outs.append(model(x, t))
    torch.cuda.synchronize()
    for i, out in enumerate(outs):
        assert torch.equal(out, expected[i % 2])


def test_bad_inputs_raise_clearly(model):
    x, t = logits(8, 10, torch.float32), targets(8, 10)
    cases = [
        ((x.cpu(), t.cpu()), RuntimeError, "the kernels take CUDA tensors"),
        ((x, t.cpu()), RuntimeError, "the kernels take CUDA tensors"),
        ((x.unsqueeze(0), t), RuntimeError, "shape"),
        ((x, t[:5]), ValueError, "batch sizes differ"),
        ((x, t.unsqueeze(1)), RuntimeError, "targets must have shape"),
        ((x, t.float()), RuntimeError, "class-probability targets must have the logits' shape"),
        ((x.double(), t), RuntimeError, "float32, bfloat16 or float16"),
        ((x, t.short()), RuntimeError, "int64 or int32"),
        ((x[:, :0], t), IndexError, "no classes"),
        ((x, [1, 2]), TypeError, "two tensors"),
    ]
    if torch.cuda.device_count() > 1:
        cases.append(((x, t.to("cuda:1")), RuntimeError, "different devices"))
    for args, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            model(*args)
    assert_matches(model(x, t), x, t)  # the CUDA context is still healthy


def test_second_device_when_present(model):
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU")
    x, t = logits(100, 1000, torch.float32, "cuda:1"), targets(100, 1000, device="cuda:1")
    assert_matches(model(x, t), x, t)


def test_run_eval_end_to_end(tmp_path):
    import run_eval
    out = tmp_path / "report.json"
    assert run_eval.main(["--trials", "10", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    for key in ("device", "torch", "cuda", "precision", "shape", "correct", "trials_passed", "model_new_ms",
                "eager_ms", "compile_ms", "floor_ms", "speedup_eager", "speedup_compile"):
        assert key in report
    assert report["correct"] and report["trials_passed"] == 5 and report["shape"] == [32768, 4096]
    assert report["speedup_eager"] > 1.0


@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_compute_sanitizer(tool):
    exe = shutil.which("compute-sanitizer")
    if exe is None:
        pytest.skip("compute-sanitizer not installed")
    both_loads = ["--both-loads"] if tool == "memcheck" else []  # see sanitize_cases.py
    proc = subprocess.run([exe, "--tool", tool, "--error-exitcode", "3", sys.executable,
                           os.path.join(ROOT, "tests", "sanitize_cases.py"), *both_loads],
                          capture_output=True, text=True, timeout=1200, env=dict(os.environ))
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, tail
    summary = {"memcheck": "ERROR SUMMARY: 0 errors", "racecheck": "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"}
    assert summary[tool] in proc.stdout + proc.stderr, tail
    assert "sanitize_cases:" in proc.stdout, tail
