"""The build: which csrc files each of the two builds compiles and in what order, assembled into one
source text per language (the same text from the package and from model_new.py, so that both build
the same extension), nvcc's flags, load_inline, and the driver's figures read through the extension.
Both builds happen just in time: the default build, which KernelBench's problem runs, on first use
(model_new.py builds it at import); the options build, the same kernels with run-time options and the
training families, on the first call that needs it. nvcc sees no torch headers in the default build,
which keeps its cold build short ("Build and host time")."""
import contextlib
import functools
import hashlib
import importlib.util
import inspect
import os
import pathlib
import posixpath
import re
import struct
import subprocess
import sys

import torch
from torch.utils.cpp_extension import CUDA_HOME, _get_build_directory, load_inline

from .gpu import DEVICE_ATTRIBUTES, gpu_from
from .params import preamble
from .sources import csrc_text

# The CUDA files of each build, in the order they are compiled: each after every file it includes.
# The options build adds the cluster exchange and the families only it launches.
_COMMON = ["common/arch.cuh", "common/formats.cuh", "common/memory.cuh", "common/lse.cuh", "common/reduce.cuh",
           "common/targets.cuh", "common/claims.cuh", "common/exact_sum.cuh", "common/row_end.cuh"]
_FAMILIES = ["families/rows.cuh", "families/tiles.cuh", "families/row_batches.cuh", "families/one_row.cuh"]
_TRAINING_FAMILIES = ["families/streamed.cuh", "families/gradient.cuh", "families/fused.cuh", "families/scale.cuh",
                      "families/split.cuh"]
CUDA_FILES = {
    False: _COMMON + _FAMILIES + ["launch.cu"],
    True: _COMMON[:5] + ["common/cluster.cuh", "common/softcap.cuh"] + _COMMON[5:] + _FAMILIES + _TRAINING_FAMILIES + ["launch.cu"],
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


def _build(targets, options=False):
    """The extension for `targets`, (compute capability, code) pairs such as ("90", "sm_90"): machine
    code (sm_), or PTX (compute_), which the driver compiles for the GPU at hand (how the tests run
    sm_75's code on a newer GPU); `options`, the options build. One line on stderr says when a build
    starts; builds of one extension take turns (_build_lock)."""
    name = "crossent_" + "_".join(code for _, code in targets) + ("_options" if options else "")
    arguments = dict(
        name=name,
        cpp_sources=[cpp_source(options)],
        cuda_sources=[cuda_source(options)],
        extra_cflags=["-O2"],
        extra_cuda_cflags=nvcc_flags([f"-gencode=arch=compute_{arch},code={code}" for arch, code in targets],
                                     os.path.join(CUDA_HOME, "bin", "ptxas") if CUDA_HOME else None),
        verbose=False,
        **_build_options(),
    )
    directory = _get_build_directory(name, False)
    digest = hashlib.sha256(repr((sorted(arguments.items()), torch.__version__)).encode()).hexdigest()
    stamp = pathlib.Path(directory, "crossent.stamp")
    with _build_lock(directory):
        module = _finished_build(stamp, digest)
        if module is None:
            print(f"crossent: building the {'options' if options else 'default'} kernels for "
                  f"{', '.join(code for _, code in targets)}, once (about {'a minute' if options else 'half a minute'} "
                  f"on 16 cores, longer on fewer: MAX_JOBS); cached in {directory} (TORCH_EXTENSIONS_DIR)",
                  file=sys.stderr, flush=True)
            module = load_inline(**arguments)
            stamp.write_text(f"{digest}\n{module.__file__}")
    return module


def _finished_build(stamp, digest):
    """The module a finished build of the same arguments left (its stamp: their digest and the library's
    path), imported as it is, or None. Not through load_inline: its ninja decides by file times, and
    where a machine's clock or file system makes those wrong, every new process rebuilds ("Build and
    host time")."""
    recorded = stamp.read_text().split("\n") if stamp.exists() else []
    if len(recorded) != 2 or recorded[0] != digest or not os.path.isfile(recorded[1]):
        return None
    spec = importlib.util.spec_from_file_location(os.path.basename(recorded[1]).split(".")[0], recorded[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _build_lock(directory):
    """One build of an extension at a time, across threads and processes: an exclusive flock on
    crossent.lock in its directory, which the system releases when its holder dies. Every build of
    these extensions takes it first, so a torch build lock ("lock", which torch never takes over)
    found while holding it was left by a build that died: removed, with a line saying so. Without
    flock (Windows), torch's lock alone."""
    if os.name != "posix":
        yield
        return
    import fcntl
    with open(os.path.join(directory, "crossent.lock"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        stale = os.path.join(directory, "lock")
        if os.path.exists(stale):
            print(f"crossent: removing {stale}, left by a build that did not finish", file=sys.stderr, flush=True)
            os.remove(stale)
        yield  # closing the file releases the flock


# TORCH_CUDA_ARCH_LIST's names, as torch reads them, and the compute capabilities they stand for.
_NAMED_ARCHS = {"Turing": "7.5", "Ampere": "8.0;8.6", "Ada": "8.9", "Hopper": "9.0", "Blackwell": "10.0;12.0"}


def arch_targets(arch_list):
    """TORCH_CUDA_ARCH_LIST's text ("8.0;9.0+PTX", "8.6 9.0", "Hopper") as (capability, code) pairs of
    7.5 and newer, the kernels' least: machine code for each, and PTX too where "+PTX" asks."""
    for name, archs in _NAMED_ARCHS.items():
        arch_list = arch_list.replace(name, archs)
    targets = []
    for entry in re.split(r"[;\s,]+", arch_list.strip()):
        found = re.fullmatch(r"(\d+)\.(\d+)(a?)(\+PTX)?", entry)
        if not found:
            raise ValueError(f"TORCH_CUDA_ARCH_LIST: cannot read {entry!r} in {arch_list!r}")
        major, minor, suffix, ptx = found.groups()
        if (int(major), int(minor)) < (7, 5):
            continue
        arch = f"{major}{minor}{suffix}"
        targets += [(arch, f"sm_{arch}")] + ([(arch, f"compute_{arch}")] if ptx else [])
    if not targets:
        raise ValueError(f"TORCH_CUDA_ARCH_LIST={arch_list!r} names no compute capability of 7.5 or newer")
    return tuple(targets)


def code_capability(targets, capability):
    """The capability of the code for `targets` that a GPU of `capability` runs, as (major, minor), or
    None where none runs there: the newest machine code of its major version and no newer minor (an
    "a" variant: its own capability alone), else the newest PTX no newer than it, which the driver
    compiles for it. The kernels' code paths (and so the launch policy's) are that capability's."""
    machine, ptx = [], []
    for arch, code in targets:
        major, minor, variant = re.fullmatch(r"(\d+?)(\d)(a?)", arch).groups()
        built = (int(major), int(minor))
        if built > capability or (variant and built != capability):
            continue
        if code.startswith("compute_"):
            ptx.append(built)
        elif built[0] == capability[0]:
            machine.append(built)
    return max(machine or ptx, default=None)


def _covers(targets, capability):
    """Whether code for `targets` runs on a GPU of `capability`."""
    return code_capability(targets, capability) is not None


@functools.lru_cache(maxsize=None)
def kernels_run_on(device_index):
    """Whether the kernels run on GPU device_index: compute capability 7.5 (Turing) or newer."""
    return torch.cuda.get_device_capability(device_index) >= (7, 5)


@functools.lru_cache(maxsize=None)
def _targets():
    """What the builds compile for: TORCH_CUDA_ARCH_LIST's capabilities where it is set (it must cover
    the GPUs present), else the current GPU's and every other visible one's of a different supported
    architecture (a host may mix them), as machine code."""
    arch_list = os.environ.get("TORCH_CUDA_ARCH_LIST", "")
    visible = set()
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) < (7, 5):
            raise RuntimeError(f"the cross-entropy kernel needs a GPU of compute capability 7.5 (Turing: T4) or "
                               f"newer; this one ({torch.cuda.get_device_name()}) has {major}.{minor}")
        visible = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())} | {(major, minor)}
    if arch_list and arch_list != "native":
        targets = arch_targets(arch_list)
        missed = sorted(c for c in visible if c >= (7, 5) and not _covers(targets, c))
        if missed:
            raise RuntimeError(f"TORCH_CUDA_ARCH_LIST={arch_list!r} leaves out the GPUs present of compute capability "
                               f"{', '.join(f'{a}.{b}' for a, b in missed)}: add them, or unset it")
        return targets
    if not visible:
        raise RuntimeError("the cross-entropy kernels need a CUDA GPU, and none is visible (or TORCH_CUDA_ARCH_LIST "
                           "to build for, ahead: prebuild)")
    return tuple((f"{a}{b}", f"sm_{a}{b}") for a, b in sorted(visible) if (a, b) >= (7, 5))


@functools.lru_cache(maxsize=None)
def default_extension():
    """The kernels KernelBench's problem runs: the defaults' families, no run-time options."""
    return _build(_targets())


@functools.lru_cache(maxsize=None)
def options_extension():
    """The same kernels with run-time options, and the streamed, gradient and fused families; built on
    their first use, so that the default build never waits for it and keeps its machine code."""
    return _build(_targets(), options=True)


def prebuild():
    """Both builds now, rather than on first use (for an image or before a cluster job starts): for
    the GPUs present, or for TORCH_CUDA_ARCH_LIST's capabilities, which needs no GPU."""
    default_extension()
    options_extension()


@functools.lru_cache(maxsize=None)
def device_gpu(device_index):
    """The launch policy's figures of GPU device_index, from the driver; its capability the code's that
    runs there (code_capability: PTX of an older one, where the builds have nothing newer)."""
    values = struct.unpack(f"={len(DEVICE_ATTRIBUTES)}i", default_extension().device_attributes(device_index))
    attributes = dict(zip((name for name, _ in DEVICE_ATTRIBUTES), values))
    attributes["major"], attributes["minor"] = code_capability(_targets(), (attributes["major"], attributes["minor"]))
    return gpu_from(attributes)
