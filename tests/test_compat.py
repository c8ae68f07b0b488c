"""Python 3.10 and torch 2.4 to 2.11: KernelBench's image runs Python 3.10 and torch 2.9. Every
Python file parses as Python 3.10 and names nothing newer from the standard library; the shipped
files (the crossent package, model_new.py bundled from it, run_eval.py and reference.py) use only
torch names that torch 2.4 has, or reach a newer one through a guard (CPU-only)."""
import ast
import glob
import os
import re

import pytest

from conftest import ROOT, read

PY_FILES = sorted(os.path.relpath(p, ROOT)
                  for pattern in ("*.py", "crossent/*.py", "tools/*.py", "tests/*.py", "bench/*.py")
                  for p in glob.glob(os.path.join(ROOT, pattern)))
# What users and KernelBench run: the package's modules, the bundle generated from them, and the
# evaluation scripts.
SHIPPED = [path for path in PY_FILES if path.startswith("crossent/")] + ["model_new.py", "run_eval.py", "reference.py"]

# Standard-library names added in Python 3.11 or later.
NEWER_STDLIB = {"tomllib", "wsgiref.types", "typing.Self", "typing.LiteralString", "typing.Never",
                "typing.assert_never", "typing.assert_type", "typing.reveal_type", "typing.Required",
                "typing.NotRequired", "typing.TypeVarTuple", "typing.Unpack", "typing.override", "enum.StrEnum",
                "datetime.UTC", "asyncio.TaskGroup", "asyncio.timeout", "contextlib.chdir", "hashlib.file_digest",
                "operator.call", "math.cbrt", "math.exp2", "itertools.batched"}

# The torch names the shipped files use, each in torch 2.4's public API. A new one joins this list
# once it is checked against torch 2.4, or reaches the code through a guard as the two below do.
TORCH_2_4 = {"torch.Tensor", "torch.float32", "torch.bfloat16", "torch.float16", "torch.int64", "torch.int32",
             "torch.empty", "torch.zeros", "torch.rand", "torch.randint", "torch.allclose", "torch.device",
             "torch.manual_seed", "torch.no_grad", "torch.compile", "torch.nn", "torch.nn.Module",
             "torch.nn.functional.cross_entropy", "torch.version.cuda", "torch.__version__",
             "torch.utils.cpp_extension", "torch.cuda.is_available", "torch.cuda.get_device_capability",
             "torch.cuda.get_device_name", "torch.cuda.get_device_properties", "torch.cuda.current_device", "torch.cuda.device_count",
             "torch.cuda.current_stream", "torch.cuda.is_current_stream_capturing", "torch.cuda.Event",
             "torch.cuda.device", "torch.cuda.empty_cache", "torch.cuda.manual_seed", "torch.cuda.synchronize",
             "torch.Generator", "torch._C", "torch.randn", "torch.softmax", "torch.finfo", "torch.empty_like",
             "torch.dtype", "torch.library",  # (the dtype class, the torch.library module: public since 1.x)
             "torch.is_grad_enabled", "torch.compiler.is_compiling", "torch.autograd.Function", "torch.ones_like",
             "torch.autocast", "torch.is_autocast_enabled", "torch.nn.CrossEntropyLoss", "torch.nn.functional",
             "torch.nn._reduction.legacy_get_string", "torch.bool", "torch.float64", "torch.logsumexp", "torch.tanh",
             "torch.is_tensor", "torch.nn.functional.pad",
             "torch.set_grad_enabled", "torch.where", "torch.ops", "torch.ones",
             "torch.autograd.graph.increment_version",  # public since 2.1
             "torch.library.custom_op",  # custom_op, with register_fake and register_autograd: new in 2.4
             "torch.get_autocast_dtype",  # new in 2.4 (pytorch/pytorch#124479)
             "torch.mm", "torch.addmm", "torch.mul", "torch.stack", "torch.zeros_like", "torch.func.vjp",
             "torch.torch_version.TorchVersion", "torch.nn.Linear", "torch.distributed", "torch.full", "torch.chunk"}
# Newer than torch 2.4, each behind a guard that does without it, in the package module that uses it
# (and in the bundle made of the modules).
GUARDED = {'getattr(torch._C, "_cuda_getCurrentRawStream", None)':  # a cheaper stream handle
           "crossent/dispatch.py",
           '"no_implicit_headers" in inspect.signature(load_inline).parameters':  # a shorter cold build
           "crossent/build.py"}


@pytest.mark.parametrize("path", PY_FILES)
def test_parses_as_python_3_10(path):
    tree = ast.parse(read(path), filename=path, feature_version=(3, 10))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
            names.add(node.module)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            names.add(f"{node.value.id}.{node.attr}")
    assert not names & NEWER_STDLIB, (path, names & NEWER_STDLIB)


def test_the_python_files_are_found():
    assert {"model_new.py", "run_eval.py", "reference.py", "crossent/__init__.py", "crossent/dispatch.py",
            "crossent/build.py", "tools/bundle.py", "tests/test_compat.py", "bench/ab.py"} <= set(PY_FILES)
    assert {"crossent/api.py", "crossent/ops.py", "crossent/autograd.py", "model_new.py"} <= set(SHIPPED)


@pytest.mark.parametrize("path", SHIPPED)
def test_uses_only_torch_2_4_names_or_guards_newer_ones(path):
    src = read(path)
    used = set(re.findall(r"\btorch(?:\.\w+)+", src))
    assert used - TORCH_2_4 == set(), sorted(used - TORCH_2_4)
    for guard, home in GUARDED.items():
        if path in (home, "model_new.py"):
            assert guard in src, (path, guard)
    assert "torch._C." not in src  # torch._C only through the guard
