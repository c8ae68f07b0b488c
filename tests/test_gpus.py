"""Every GPU a leaderboard offers (plans.GPUS: T4 to B200). On the CPU, the plans each one's
figures give are legal and sensible. On the GPU at hand, the driver's figures are what the policy
reads; each listed GPU's plans, forced here, give correct results; and the code sm_75 gets, built
as compute_75 PTX that the driver compiles for this GPU, runs correctly under sm_75's plans."""
import pytest
import torch

from cases import DTYPES, PATHS, SHAPES as GPU_SHAPES, logits, targets, views
from crossent import build, params
from crossent import policy as launch_policy
from crossent.constants import ONE_ROW, ROW_BATCHES, ROWS, THREADS, TILES
from crossent.gpu import DEVICE_ATTRIBUTES
from gpu_checks import assert_matches, special_rows
from plans import GPU_PLANS, GPUS, SHAPES, plan

FAMILIES = (ROWS, TILES, ROW_BATCHES, ONE_ROW)
LARGE = 64 << 20  # logits of this many bytes or more keep every SM busy


# ------------------------------------------------------------------ the policy (CPU)
@pytest.mark.parametrize("name", GPUS)
def test_every_family_fits_every_gpu(name):
    """CTAs per SM within the launch bounds (test_cuda_source reads those from the PTX), the SM's
    threads and its shared memory."""
    g = GPU_PLANS[name]
    for family in FAMILIES:
        ctas = launch_policy._ctas_per_sm(family, g)
        assert 1 <= ctas <= (2 if g.cc < 80 or g.cc >= 100 else 3), (family, ctas)
        assert ctas * THREADS <= g.threads_per_sm
        assert ctas * (launch_policy._CTA_SHARED_BYTES[family] + g.smem_reserved) <= g.smem_per_sm
    # one CTA of the one-row kernel, at its most threads, fits one SM
    assert launch_policy._one_row_threads(g) == (512 if g.cc < 80 else 1024) <= g.threads_per_sm


@pytest.mark.parametrize("name", GPUS)
@pytest.mark.parametrize("elem_bytes", [4, 2])
def test_every_gpus_plans_are_legal_and_sensible(name, elem_bytes):
    g = GPU_PLANS[name]
    for rows, cols in SHAPES + [(262144, 250), (8192, 16001), (2000000, 24)]:
        p = plan(rows, cols, elem_bytes, on=g)
        where = (name, rows, cols, elem_bytes, p)
        assert 1 <= p.grid <= launch_policy._max_grid(p.family, g) and p.grid < 2**31, where
        if p.family == ONE_ROW:
            assert 32 <= p.group <= launch_policy._one_row_threads(g), where
        else:
            assert p.chunks >= p.grid or p.chunks == 0, where
        if p.splits > 1:  # a partial per segment, all in the workspace
            assert params.workspace_layout(p.splits, rows)[-1] >= 16 * rows * p.splits + 176, where
        if rows * cols * elem_bytes >= LARGE:
            assert p.grid >= g.sms, where


def test_the_rules_each_gpu_gets():
    """Where the GPUs differ: CTAs per SM (registers before sm_80 and on Blackwell, shared memory for
    tiles), the one-row kernel's size on sm_75, and fast memory (policy._fast_memory)."""
    ctas = {name: tuple(launch_policy._ctas_per_sm(f, g) for f in FAMILIES) for name, g in GPU_PLANS.items()}
    #          rows, tiles, row batches, one row
    assert ctas["T4"] == (2, 1, 2, 2)
    assert ctas["A10G"] == ctas["L4"] == ctas["L40S"] == (3, 2, 3, 3)
    assert ctas["A100-80GB"] == ctas["H100"] == ctas["H200"] == (3, 3, 3, 3)
    assert ctas["B200"] == (2, 2, 2, 2) and ctas["RTX 5090"] == (2, 2, 2, 2)
    assert plan(1, 32768, 4, on=GPU_PLANS["H100"]).family == ONE_ROW
    assert plan(1, 32768, 4, on=GPU_PLANS["T4"]).family == ROWS  # past 512 threads' batch
    assert plan(1, 16384, 4, on=GPU_PLANS["T4"]).family == ONE_ROW
    assert {name for name, g in GPU_PLANS.items() if launch_policy._fast_memory(g)} == {"H200", "B200"}


def test_every_table_gives_what_the_driver_is_asked():
    """plans.GPUS gives each of gpu.DEVICE_ATTRIBUTES (test_cuda_source compiles the runtime's enumerators;
    the GPU test checks their values against torch's)."""
    assert all(set(table) == {name for name, _ in DEVICE_ATTRIBUTES} for table in GPUS.values())


@pytest.fixture
def fresh_targets(monkeypatch):
    """build._targets, cached per process, read afresh under the test's patched torch.cuda and
    environment, and its cache dropped again before the patches are undone, so that no other test
    sees the fake GPUs. (The builds' own caches are left alone: the tests call the functions they wrap.)"""
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    build._targets.cache_clear()
    yield build._targets
    build._targets.cache_clear()


def _fake_gpus(monkeypatch, capabilities):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(capabilities))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(capabilities))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: capabilities[i])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla V100-SXM2-16GB")
    monkeypatch.setattr(build, "_build", lambda targets, options=False: (targets, options))


def test_the_build_covers_every_visible_architecture(monkeypatch, fresh_targets):
    """A host mixing GPUs gets code for each supported one; the current one decides the refusal."""
    _fake_gpus(monkeypatch, {0: (9, 0), 1: (8, 0), 2: (9, 0), 3: (7, 0)})
    expected = (("80", "sm_80"), ("90", "sm_90"))
    assert fresh_targets() == expected
    assert build.default_extension.__wrapped__() == (expected, False)
    assert build.options_extension.__wrapped__() == (expected, True)


def test_a_gpu_older_than_sm75_is_refused_by_name(monkeypatch, fresh_targets):
    _fake_gpus(monkeypatch, {0: (7, 0)})
    monkeypatch.setattr(build, "_build", lambda *a, **k: pytest.fail("built for an unsupported GPU"))
    refusal = r"compute capability 7\.5 \(Turing: T4\) or newer; this one \(Tesla V100-SXM2-16GB\) has 7\.0"
    for call in (fresh_targets, build.default_extension.__wrapped__, build.options_extension.__wrapped__):
        with pytest.raises(RuntimeError, match=refusal):
            call()


def test_torch_cuda_arch_list_is_read_as_torch_reads_it():
    assert build.arch_targets("8.0;9.0") == (("80", "sm_80"), ("90", "sm_90"))
    assert build.arch_targets("7.0 7.5 8.6+PTX") == (("75", "sm_75"), ("86", "sm_86"), ("86", "compute_86"))
    assert build.arch_targets("Ampere;Hopper") == (("80", "sm_80"), ("86", "sm_86"), ("90", "sm_90"))
    assert build.arch_targets("9.0a") == (("90a", "sm_90a"),)
    for bad in ("6.1", "sm_90", "9"):
        with pytest.raises(ValueError, match="TORCH_CUDA_ARCH_LIST"):
            build.arch_targets(bad)


def test_torch_cuda_arch_list_decides_the_build_and_must_cover_the_gpus(monkeypatch, fresh_targets):
    """Set, it is what both builds compile for, with no GPU at all (prebuild for an image), and it
    must cover the GPUs present: machine code of their major version and no newer minor, or PTX."""
    _fake_gpus(monkeypatch, {})
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0")
    assert fresh_targets() == (("80", "sm_80"), ("90", "sm_90"))
    built = []
    monkeypatch.setattr(build, "_build", lambda targets, options=False: built.append((targets, options)))
    build.default_extension.cache_clear(), build.options_extension.cache_clear()
    build.prebuild()
    build.default_extension.cache_clear(), build.options_extension.cache_clear()
    assert built == [(fresh_targets(), False), (fresh_targets(), True)]
    for arch_list, capability, covered in [("8.0", (8, 6), True), ("8.6", (8, 0), False), ("8.0", (9, 0), False),
                                           ("8.0+PTX", (9, 0), True), ("9.0a", (9, 0), True), ("9.0a", (10, 0), False)]:
        build._targets.cache_clear()
        _fake_gpus(monkeypatch, {0: capability})
        monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", arch_list)
        if covered:
            assert fresh_targets() == build.arch_targets(arch_list)
        else:
            with pytest.raises(RuntimeError, match="leaves out the GPUs present"):
                fresh_targets()


def test_the_policy_plans_for_the_code_that_runs():
    """The capability the kernels' code paths take on a GPU: its own machine code's, or an older one's
    PTX, which the driver compiles (whose kernels then lack the newer instructions: no TMA or clusters
    from compute_80 on a 9.0 GPU)."""
    for arch_list, capability, code in [("8.0;9.0", (9, 0), (9, 0)), ("8.0+PTX", (9, 0), (8, 0)),
                                        ("8.0+PTX;9.0", (9, 0), (9, 0)), ("8.0;9.0+PTX", (10, 0), (9, 0)),
                                        ("8.6", (8, 9), (8, 6)), ("9.0a", (9, 0), (9, 0)), ("9.0a+PTX", (10, 0), None),
                                        ("8.0", (9, 0), None), ("7.5;8.0+PTX", (8, 6), (8, 0))]:
        assert build.code_capability(build.arch_targets(arch_list), capability) == code, (arch_list, capability)


def test_no_gpu_and_no_arch_list_says_so(monkeypatch, fresh_targets):
    _fake_gpus(monkeypatch, {})
    with pytest.raises(RuntimeError, match="none is visible"):
        fresh_targets()


# ------------------------------------------------------------------ on the GPU
@pytest.mark.gpu
def test_the_drivers_figures_are_this_gpus():
    index = torch.cuda.current_device()
    g, props = build.device_gpu(index), torch.cuda.get_device_properties(index)
    code = build.code_capability(build._targets(), (props.major, props.minor))
    assert g.cc == 10 * code[0] + code[1] and g.sms == props.multi_processor_count
    assert g.threads_per_sm == props.max_threads_per_multi_processor and g.l2_bytes == props.L2_cache_size
    if hasattr(props, "memory_clock_rate"):
        assert g.bandwidth == 2e3 * props.memory_clock_rate * props.memory_bus_width / 8
    name = torch.cuda.get_device_name(index)
    key = "H200" if name == "NVIDIA H200" else "H100" if name == "NVIDIA H100 80GB HBM3" else None
    if key is None or g.sms != GPU_PLANS[key].sms:  # another part of the name, or a MIG slice
        pytest.skip(f"{name}: plans.GPUS has no table of this exact GPU to check")
    assert g == GPU_PLANS[key], (name, g)


def _check_shapes(model):
    for dtype in DTYPES.values():
        for rows, cols in GPU_SHAPES + list(PATHS.values()):
            x, t = logits(rows, cols, dtype), targets(rows, cols)
            assert_matches(model(x, t), x, t)
        for view_name, x in views(64, 1003, dtype):
            t = targets(x.shape[0], x.shape[1])
            assert_matches(model(x, t), x, t)


@pytest.mark.gpu
@pytest.mark.parametrize("name", GPUS)
def test_each_gpus_plans_run_correctly_here(model, policy, name):
    """Another GPU's grids, CTAs per SM, one-row sizes and load kinds, launched on this one."""
    policy("device_gpu", lambda _: GPU_PLANS[name])
    _check_shapes(model)


@pytest.fixture(scope="module")
def sm75_code():
    return build._build((("75", "compute_75"),))


@pytest.mark.gpu
@pytest.mark.parametrize("planned_for", ["this GPU as sm_75", "T4"])
def test_the_code_sm75_gets_runs_correctly_through_ptx(model, policy, sm75_code, planned_for):
    """sm_75's code (no cp.async, bf16 through float conversion, the packed max emulated), compiled
    by the driver for this GPU, under the plans sm_75 gets."""
    g = build.device_gpu(torch.cuda.current_device())._replace(cc=75) if planned_for != "T4" else GPU_PLANS["T4"]
    policy("default_extension", lambda: sm75_code)
    policy("device_gpu", lambda _: g)
    _check_shapes(model)
    # NaN, +-inf and all -inf through the emulated max and bf16 conversion, in every family
    for dtype in DTYPES.values():
        for cols in (10, 77, 4096, 40000):
            x, t = special_rows(cols)
            x = x.to(dtype)
            for rows in [slice(None)] + [slice(r, r + 1) for r in range(x.shape[0])]:
                got = model(x[rows], t[rows]).float()
                expected = torch.nn.functional.cross_entropy(x[rows].float(), t[rows])
                assert torch.isnan(got) == torch.isnan(expected), (dtype, cols, rows, got, expected)
                if not torch.isnan(expected):
                    assert torch.isinf(got) == torch.isinf(expected) and torch.allclose(got, expected, rtol=1e-2)

