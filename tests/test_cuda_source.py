"""The embedded CUDA source compiles for sm_80 and sm_90 with no register spills (CPU-only: nvcc)."""
import os
import re
import shutil
import subprocess

import pytest

import model_new

NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
PTXAS = os.path.join(os.path.dirname(os.path.realpath(NVCC)), "ptxas") if NVCC else None


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("arch", ["80", "90"])
def test_compiles_without_spills(arch, tmp_path):
    src = tmp_path / "cross_entropy.cu"
    src.write_text(model_new._CUDA_SRC)
    # The flags the import builds with, this toolkit's parallel ptxas included where it has it.
    flags = model_new._nvcc_flags([f"-gencode=arch=compute_{arch},code=sm_{arch}"], PTXAS)
    proc = subprocess.run([NVCC, "-c", *flags, "-Xptxas", "-v,-warn-spills,-warn-lmem-usage", str(src),
                           "-o", str(tmp_path / "ce.o")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    report = proc.stderr
    kernels = re.findall(r"Compiling entry function '(\w+)'", report)
    # 3 logit dtypes x 2 target dtypes x rows in registers, in tiles, short rows in tiles element by
    # element or short rows in tiles in pairs x plain or evict-first loads, and evict-first rows in
    # registers that keep the 16-byte grid (no lead: _lead_256); the row-batch kernel: 3 logit dtypes
    # x 1 or 2 rows a batch x plain or evict-first loads; and the one-row kernel, one per logit dtype
    assert len(kernels) == 48 + 6 + 12 + 3, report
    assert sum("row_batch" in k for k in kernels) == 12, report
    assert sum("one_row" in k for k in kernels) == 3, report
    spills = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert len(spills) == len(kernels), report
    assert all(s == ("0", "0", "0") for s in spills), report
    assert "warning" not in report.lower(), report
    # The launch bounds leave 65536 / (threads per SM) registers, in steps of 8.
    budget = 65536 // (model_new._THREADS * model_new._CTAS_PER_SM) // 8 * 8
    one_row_budget = 65536 // model_new._ONE_ROW_THREADS // 8 * 8
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", report)]
    assert len(regs) == len(kernels), report
    for kernel, used in zip(kernels, regs):
        assert used <= (one_row_budget if "one_row" in kernel else budget), (kernel, used)


def test_cpp_binding_declares_what_cuda_defines():
    decl = re.search(r"void launch_cross_entropy_mean\(([^)]*)\);", model_new._CPP_SRC).group(1)
    defn = re.search(r"void launch_cross_entropy_mean\(([^)]*)\) \{", model_new._CUDA_SRC).group(1)
    assert " ".join(decl.split()) == " ".join(defn.split())


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
