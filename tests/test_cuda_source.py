"""The CUDA source (crossent/csrc, as build.cuda_source assembles it), its default build and its
options build, compiles for every architecture a leaderboard's GPUs have (sm_75 to sm_120) into the
instances the launch can pick, with no register spills and no more shared memory than the policy
counts, and the host module's C++ with it (CPU-only: nvcc)."""
import inspect
import os
import re
import subprocess
import sysconfig

import pytest
from torch.utils import cpp_extension

from conftest import NVCC
from crossent import build, policy
from crossent.constants import (FUSED, GRADIENT, ONE_ROW, ROUND, ROW_BATCHES, ROWS, SCALE, SEG_SLAB, SPLIT_MERGE,
                                SPLIT_TERMS, STREAMED, THREADS, TILES)
from crossent.gpu import Gpu
from plans import GPUS

PTXAS = os.path.join(os.path.dirname(os.path.realpath(NVCC)), "ptxas") if NVCC else None

# Instances per family: 3 logit dtypes x, for rows in registers, 2 target types x (plain, evict-first,
# evict-first without the 256-byte lead); for tiles, 2 target types x 3 sweeps x 2 kinds of load;
# for row batches, 1 or 2 rows x 2 kinds of load; one row, the dtype alone. The options build adds
# the streamed family: plain or soft-capped logits x contiguous or strided classes x (class indices,
# probabilities of the logits' dtype, float32 probabilities: one instance with the second for
# float32 logits), with the class weights' shifted copies, one a dtype, and the gradient, in the same
# instances; and the fused family, plain or soft-capped logits and plain ones held by a cluster, with
# its divisor's kernel, the in-place gradient's scaling, a split vocabulary's terms and merge, and a
# float32 sum's rounding, one a dtype.
INSTANCES = {"rows": 3 * 2 * 3, "tiles": 3 * 2 * 3 * 2, "row_batches": 3 * 2 * 2, "one_row": 3}
OPTIONS_INSTANCES = {**INSTANCES, "streamed": 2 * 2 * (2 + 3 + 3), "weight_phases": 3,
                     "gradient": 2 * 2 * (2 + 3 + 3), "fused": 3 * 3, "divisor": 3, "scale": 3, "split_terms": 3,
                     "split_merge": 3, "round": 3}
FAMILY_CODES = {"rows": ROWS, "tiles": TILES, "row_batches": ROW_BATCHES, "one_row": ONE_ROW, "streamed": STREAMED,
                "weight_phases": STREAMED, "gradient": GRADIENT, "fused": FUSED, "divisor": FUSED, "scale": SCALE,
                "split_terms": SPLIT_TERMS, "split_merge": SPLIT_MERGE, "round": ROUND}
# Shared memory a family's launch adds to its arrays: rows in registers, segments_total's slab.
DYNAMIC_SHARED = {"rows": 16 * SEG_SLAB + 4 * THREADS}
ARCHS = sorted({f"{t['major']}{t['minor']}" for t in GPUS.values()}, key=int)


def test_every_listed_gpu_has_its_architecture_compiled():
    assert ARCHS == ["75", "80", "86", "89", "90", "100", "120"]


# The options build (kOptions) for each register regime: sm_75's, sm_80 to sm_90's, Blackwell's.
BUILDS = [(arch, False) for arch in ARCHS] + [(arch, True) for arch in ("75", "90", "100")]


@pytest.mark.nvcc
@pytest.mark.parametrize("arch, options", BUILDS, ids=[f"sm_{a}" + ("-options" if o else "") for a, o in BUILDS])
def test_compiles_without_spills(arch, options, tmp_path):
    src = tmp_path / "cross_entropy.cu"
    src.write_text(build.cuda_source(options))
    # The flags the build compiles with, this toolkit's parallel ptxas included where it has it.
    flags = build.nvcc_flags([f"-gencode=arch=compute_{arch},code=sm_{arch}"], PTXAS)
    proc = subprocess.run([NVCC, "-c", *flags, "-Xptxas", "-v,-warn-spills,-warn-lmem-usage", "-keep", "-keep-dir",
                           str(tmp_path), str(src), "-o", str(tmp_path / "ce.o")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    report = proc.stderr
    assert "warning" not in report.lower(), report
    kernels = re.findall(r"Compiling entry function '(\w+)'", report)
    families = [re.search(r"cross_entropy_([a-z_]+?)_kernelI", k).group(1) for k in kernels]
    instances = OPTIONS_INSTANCES if options else INSTANCES
    assert {f: families.count(f) for f in instances} == instances and len(kernels) == sum(instances.values()), report
    spills = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert len(spills) == len(kernels), report
    assert all(s == ("0", "0", "0") for s in spills), report
    # The launch bounds in the PTX are the policy's: CTAs per SM (_more_registers) and the one-row
    # kernel's threads (_one_row_threads).
    gpu = Gpu(int(arch), 1, 0, 2048, 1 << 20, 0, 0.0)
    ctas, one_row_threads = policy._ctas_per_sm(ROWS, gpu), policy._one_row_threads(gpu)
    assert ctas == (3 if 80 <= int(arch) < 100 else 2) and one_row_threads == (512 if arch == "75" else 1024)
    ptx = (tmp_path / "cross_entropy.ptx").read_text()
    bounds = re.findall(r"\.entry \w+?\dcross_entropy_(\w+?)_kernelI\w*\([^)]*\)\s*\.maxntid (\d+)(?:, 1, 1)?\s*"
                        r"(?:\.minnctapersm (\d+))?", ptx)
    assert len(bounds) == len(kernels), len(bounds)
    for family, threads, min_ctas in bounds:
        expected = (str(one_row_threads), "") if family == "one_row" else (str(THREADS), str(ctas))
        assert (threads, min_ctas) == expected, (family, threads, min_ctas)
    # The launch bounds leave 65536 / (threads per SM) registers, in steps of 8.
    budget = {f: 65536 // (THREADS * ctas) // 8 * 8 for f in OPTIONS_INSTANCES}
    budget["one_row"] = 65536 // one_row_threads // 8 * 8
    usage = re.findall(r"Used (\d+) registers(?:, used \d+ barriers)?(?:, (\d+) bytes smem)?", report)  # none: 0
    assert len(usage) == len(kernels), report
    for kernel, family, (registers, smem) in zip(kernels, families, usage):
        assert int(registers) <= budget[family], (kernel, registers)
        # The policy's count of a CTA's shared memory (_CTA_SHARED_BYTES) holds it, with at most 1 KB
        # to spare, and the options build's own arrays where an instance lacks them (the default build;
        # label smoothing's slots in plain-load rows): CTAs per SM follow from it.
        code = FAMILY_CODES[family]
        counted = policy._CTA_SHARED_BYTES[code] - DYNAMIC_SHARED.get(family, 0)
        spare = 1024 + policy._OPTIONS_SHARED_BYTES.get(code, 0)
        assert counted - spare <= int(smem or 0) <= counted, (kernel, smem, counted)


def _fake_ptxas(path, usage):
    path.write_text(f"#!/bin/sh\necho '{usage}'\n")
    path.chmod(0o755)
    return str(path)


def test_ptxas_runs_on_every_core_only_where_it_can(tmp_path):
    new = _fake_ptxas(tmp_path / "ptxas_new", "--split-compile <N>  (-split-compile)")
    old = _fake_ptxas(tmp_path / "ptxas_old", "--maxrregcount <N>  (-maxrregcount)")
    assert build._parallel_ptxas_flags(new) == ["-Xptxas", "-split-compile=0"]
    assert build._parallel_ptxas_flags(old) == []
    assert build._parallel_ptxas_flags(str(tmp_path / "missing")) == []
    assert build._parallel_ptxas_flags(None) == []
    assert build.nvcc_flags(["-arch=sm_90"], new)[-2:] == ["-Xptxas", "-split-compile=0"]


def _host_standard():
    """The C++ standard this torch's load_inline compiles the host module with, from cpp_extension's
    ninja rules (C++17 in torch 2.4, C++20 in 2.13); C++17 where they cannot be read."""
    try:
        rules = inspect.getsource(cpp_extension._write_ninja_file_to_build_library)
    except (AttributeError, OSError, TypeError):
        return "c++17"
    return max(re.findall(r"-std=(c\+\+\d+)", rules), key=lambda std: int(std[3:]), default="c++17")


@pytest.mark.nvcc
@pytest.mark.parametrize("options", [False, True], ids=["default", "options"])
def test_the_host_module_compiles(options, tmp_path):
    """The host module's C++ (csrc/module.cpp, and the options build's training node, which reads
    torch's headers) compiles against this torch's headers, as load_inline builds it (its C++
    standard too): nvcc drives the host compiler, with CUDA's headers."""
    src = tmp_path / "main.cpp"
    src.write_text(build.cpp_source(options))
    includes = [f"-I{path}" for path in [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]]
    # torch's CPU wheel leaves out the header a CUDA build generates for c10/cuda's macros: a stand-in
    macros = "c10/cuda/impl/cuda_cmake_macros.h"
    if not os.path.exists(os.path.join(cpp_extension.include_paths()[0], macros)):
        (tmp_path / macros).parent.mkdir(parents=True)
        (tmp_path / macros).write_text("#define C10_CUDA_BUILD_SHARED_LIBS\n")
        includes.append(f"-I{tmp_path}")
    name = "crossent_sm_90" + ("_options" if options else "")
    proc = subprocess.run([NVCC, "-x", "c++", f"-std={_host_standard()}", f"-DTORCH_EXTENSION_NAME={name}", *includes,
                           "-Xcompiler", "-fsyntax-only", "-c", str(src), "-o", str(tmp_path / "main.o")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
