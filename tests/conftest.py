"""What the tests share: the repository's root on the path (the bundle, reference.py, run_eval.py and
bench/ live there), the markers' skips, and fixtures for the public API and the launch policy.

Markers: `gpu` tests need a CUDA GPU and skip, saying why, where none is visible; `nvcc` tests compile
CUDA with nvcc (CPU-only, slow) and skip where it is missing. `-m "not nvcc"` runs the rest in seconds."""
import os
import shutil
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CUDA = torch.cuda.is_available()
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason="no CUDA GPU visible: the GPU part of the suite runs on a GPU machine")
    no_nvcc = pytest.mark.skip(reason="nvcc not found: the CUDA compile tests need the CUDA toolkit")
    for item in items:
        if "gpu" in item.keywords and not CUDA:
            item.add_marker(no_gpu)
        if "nvcc" in item.keywords and NVCC is None:
            item.add_marker(no_nvcc)


def read(name):
    with open(os.path.join(ROOT, name)) as f:
        return f.read()


@pytest.fixture(scope="module")
def model():
    import crossent
    return crossent.ModelNew()


@pytest.fixture
def policy(monkeypatch):
    """Replaces a name the dispatch plans or launches with for a test: a policy function
    ("_evict_first"), the GPU the policy reads ("device_gpu"), an extension ("default_extension").
    Each module that holds the name gets the replacement (the package imports names, not modules), and
    the problems the dispatch keeps (their plans) are dropped on the way in and on the way out, so that
    no test sees another's."""
    from crossent import dispatch, gradient
    from crossent import policy as launch_policy
    modules = (launch_policy, dispatch, gradient)
    forget = dispatch.forget_problems  # (itself replaceable)

    def replace(name, value):
        holders = [module for module in modules if hasattr(module, name)]
        assert holders, f"no module of the dispatch holds {name}"
        for module in holders:
            monkeypatch.setattr(module, name, value)
        forget()
    yield replace
    forget()
