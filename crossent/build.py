"""The build: which csrc files each of the two builds compiles and in what order, assembled into one
source text per language (the same text from the package and from model_new.py, so that both build
the same extension), nvcc's flags, load_inline, and the driver's figures read through the extension.
Both builds happen just in time: the default build, which KernelBench's problem runs, on first use
(model_new.py builds it at import); the options build, the same kernels with run-time options and the
training families, on the first call that needs it. nvcc sees no torch headers in the default build,
which keeps its cold build short ("Build and host time")."""
import functools
import inspect
import os
import posixpath
import re
import struct
import subprocess

import torch
from torch.utils.cpp_extension import CUDA_HOME, load_inline

from .gpu import DEVICE_ATTRIBUTES, gpu_from
from .params import preamble
from .sources import csrc_text

# The CUDA files of each build, in the order they are compiled: each after every file it includes.
# The options build adds the cluster exchange and the families only it launches.
_COMMON = ["common/arch.cuh", "common/formats.cuh", "common/memory.cuh", "common/lse.cuh", "common/reduce.cuh",
           "common/targets.cuh", "common/claims.cuh", "common/exact_sum.cuh", "common/row_end.cuh"]
_FAMILIES = ["families/rows.cuh", "families/tiles.cuh", "families/row_batches.cuh", "families/one_row.cuh"]
_TRAINING_FAMILIES = ["families/streamed.cuh", "families/gradient.cuh", "families/fused.cuh", "families/scale.cuh"]
CUDA_FILES = {
    False: _COMMON + _FAMILIES + ["launch.cu"],
    True: _COMMON[:5] + ["common/cluster.cuh"] + _COMMON[5:] + _FAMILIES + _TRAINING_FAMILIES + ["launch.cu"],
}
CPP_FILES = {False: ["module.cpp"], True: ["training_node.cpp", "module.cpp"]}

_LOCAL_INCLUDE = re.compile(r'#include "([^"]+)"')


def assemble(names, options=False):
    """One source text of the csrc files `names`, in order. A file's includes of other csrc files are
    dropped (it comes after them: checked), the generated params.h (params.preamble) stands where it is
    first included, and #line directives keep the compiler's messages on the files' own lines."""
    done, lines = set(), []
    for name in names:
        lines.append(f'#line 1 "crossent/csrc/{name}"')
        for number, line in enumerate(csrc_text(name).rstrip("\n").split("\n"), 1):
            include = _LOCAL_INCLUDE.match(line)
            if include:
                target = posixpath.normpath(posixpath.join(posixpath.dirname(name), include.group(1)))
                if target == "params.h" and target not in done:
                    lines += [preamble(options), f'#line {number + 1} "crossent/csrc/{name}"']
                    done.add(target)
                    continue
                if target not in done:
                    raise ValueError(f"csrc/{name} includes {target}, which the build does not put ahead of it")
                line = ""
            elif line == "#pragma once":
                line = ""
            lines.append(line)
        done.add(name)
    return "\n".join(lines) + "\n"


def cuda_source(options=False):
    return assemble(CUDA_FILES[options], options)


def cpp_source(options=False):
    """The host's module: the launch and the driver's figures, and in the options build the training node."""
    return assemble(CPP_FILES[options], options)


def nvcc_flags(arch_flags, ptxas=None):
    return ["-O3", "-std=c++17", *arch_flags, *_parallel_ptxas_flags(ptxas)]


def _parallel_ptxas_flags(ptxas):
    """ptxas assembles the kernels on every core (-split-compile=0): the same machine code, kernel by
    kernel, and a shorter cold build. Not nvcc's own --split-compile, which splits the optimizer's
    module too and changes the code. Only where this toolkit's ptxas lists the option: an older one
    rejects it ("Build and host time")."""
    if not ptxas or not os.access(ptxas, os.X_OK):
        return []
    usage = subprocess.run([ptxas, "--help"], capture_output=True, text=True).stdout
    return ["-Xptxas", "-split-compile=0"] if "--split-compile" in usage else []


def _build_options():
    """The default build needs no torch headers: where load_inline can leave them out, a cold build is
    shorter."""
    return {"no_implicit_headers": True} if "no_implicit_headers" in inspect.signature(load_inline).parameters else {}


def _build(archs, ptx=False, options=False):
    """The extension for the compute capabilities `archs` (["90"]): machine code for each, or (ptx)
    only PTX, which the driver compiles for the GPU at hand (how the tests run sm_75's code on a newer
    GPU); `options`, the options build."""
    codes = [f"compute_{arch}" if ptx else f"sm_{arch}" for arch in archs]
    return load_inline(
        name="crossent_" + "_".join(codes) + ("_options" if options else ""),
        cpp_sources=[cpp_source(options)],
        cuda_sources=[cuda_source(options)],
        extra_cflags=["-O2"],
        extra_cuda_cflags=nvcc_flags(
            [f"-gencode=arch=compute_{arch},code={code}" for arch, code in zip(archs, codes)],
            os.path.join(CUDA_HOME, "bin", "ptxas") if CUDA_HOME else None),
        verbose=False,
        **_build_options(),
    )


@functools.lru_cache(maxsize=None)
def _archs():
    """What the builds compile for: the current GPU, and every other visible one of a different
    supported architecture (a host may mix them)."""
    if not torch.cuda.is_available():
        raise RuntimeError("the cross-entropy kernels need a CUDA GPU, and none is visible")
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (7, 5):
        raise RuntimeError(f"the cross-entropy kernel needs a GPU of compute capability 7.5 (Turing: T4) or newer; "
                           f"this one ({torch.cuda.get_device_name()}) has {major}.{minor}")
    visible = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())} | {(major, minor)}
    return tuple(f"{a}{b}" for a, b in sorted(visible) if (a, b) >= (7, 5))


@functools.lru_cache(maxsize=None)
def default_extension():
    """The kernels KernelBench's problem runs: the defaults' families, no run-time options."""
    return _build(list(_archs()))


@functools.lru_cache(maxsize=None)
def options_extension():
    """The same kernels with run-time options, and the streamed, gradient and fused families; built on
    their first use, so that the default build never waits for it and keeps its machine code."""
    return _build(list(_archs()), options=True)


@functools.lru_cache(maxsize=None)
def device_gpu(device_index):
    """The launch policy's figures of GPU device_index, from the driver."""
    values = struct.unpack(f"={len(DEVICE_ATTRIBUTES)}i", default_extension().device_attributes(device_index))
    return gpu_from(dict(zip((name for name, _ in DEVICE_ATTRIBUTES), values)))
