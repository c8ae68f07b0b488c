"""The embedded CUDA source compiles for sm_80 and sm_90 into the instances the launch can pick,
with no register spills (CPU-only: nvcc)."""
import os
import re
import shutil
import subprocess

import pytest

import model_new

NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
PTXAS = os.path.join(os.path.dirname(os.path.realpath(NVCC)), "ptxas") if NVCC else None

# Instances per family: 3 logit dtypes x, for rows in registers, 2 target types x (plain, evict-first,
# evict-first without the 256-byte lead); for tiles, 2 target types x 3 sweeps x 2 kinds of load;
# for row batches, 1 or 2 rows x 2 kinds of load; one row, the dtype alone.
INSTANCES = {"rows": 3 * 2 * 3, "tiles": 3 * 2 * 3 * 2, "row_batches": 3 * 2 * 2, "one_row": 3}


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("arch", ["80", "90"])
def test_compiles_without_spills(arch, tmp_path):
    src = tmp_path / "cross_entropy.cu"
    src.write_text(model_new._cuda_source())
    # The flags the import builds with, this toolkit's parallel ptxas included where it has it.
    flags = model_new._nvcc_flags([f"-gencode=arch=compute_{arch},code=sm_{arch}"], PTXAS)
    proc = subprocess.run([NVCC, "-c", *flags, "-Xptxas", "-v,-warn-spills,-warn-lmem-usage", str(src),
                           "-o", str(tmp_path / "ce.o")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    report = proc.stderr
    assert "warning" not in report.lower(), report
    kernels = re.findall(r"Compiling entry function '(\w+)'", report)
    families = [re.search(r"cross_entropy_([a-z_]+?)_kernelI", k).group(1) for k in kernels]
    assert {f: families.count(f) for f in INSTANCES} == INSTANCES and len(kernels) == sum(INSTANCES.values()), report
    spills = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert len(spills) == len(kernels), report
    assert all(s == ("0", "0", "0") for s in spills), report
    # The launch bounds leave 65536 / (threads per SM) registers, in steps of 8.
    budget = 65536 // (model_new._THREADS * model_new._CTAS_PER_SM) // 8 * 8
    one_row_budget = 65536 // model_new._ONE_ROW_THREADS // 8 * 8
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", report)]
    assert len(regs) == len(kernels), report
    for kernel, used in zip(kernels, regs):
        assert used <= (one_row_budget if "one_row" in kernel else budget), (kernel, used)


def _fake_ptxas(path, usage):
    path.write_text(f"#!/bin/sh\necho '{usage}'\n")
    path.chmod(0o755)
    return str(path)


def test_ptxas_runs_on_every_core_only_where_it_can(tmp_path):
    new = _fake_ptxas(tmp_path / "ptxas_new", "--split-compile <N>  (-split-compile)")
    old = _fake_ptxas(tmp_path / "ptxas_old", "--maxrregcount <N>  (-maxrregcount)")
    assert model_new._parallel_ptxas_flags(new) == ["-Xptxas", "-split-compile=0"]
    assert model_new._parallel_ptxas_flags(old) == []
    assert model_new._parallel_ptxas_flags(str(tmp_path / "missing")) == []
    assert model_new._parallel_ptxas_flags(None) == []
    assert model_new._nvcc_flags(["-arch=sm_90"], new)[-2:] == ["-Xptxas", "-split-compile=0"]
