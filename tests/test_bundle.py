"""model_new.py is the bundle of the package (tools/bundle.py), runs as KernelBench loads it, and hands
load_inline the package's own source text; the build's assembly of csrc keeps each file's lines.
CPU-only: nothing is built."""
import os
import re
import sys

import pytest

from conftest import ROOT, read

sys.path.insert(0, os.path.join(ROOT, "tools"))
import bundle  # noqa: E402

from crossent import build  # noqa: E402
from crossent.sources import csrc_text  # noqa: E402


@pytest.fixture(scope="module")
def bundled():
    """model_new.py exec'd from a string into a namespace of its own, as KernelBench loads it."""
    context = {}
    exec(compile(read("model_new.py"), "model_new.py", "exec"), context)
    return context


def test_model_new_is_the_fresh_bundle():
    assert read("model_new.py") == bundle.bundle(), "model_new.py is stale: run python3 tools/bundle.py"


def test_check_fails_with_a_diff_on_a_stale_bundle(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "model_new.py"
    stale.write_text(bundle.bundle().replace("THREADS = 256", "THREADS = 128"))
    monkeypatch.setattr(bundle, "OUTPUT", stale)
    monkeypatch.setattr(sys, "argv", ["bundle.py", "--check"])
    assert bundle.main() == 1
    assert "-THREADS = 128" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["bundle.py"])
    assert bundle.main() == 0 and stale.read_text() == bundle.bundle()


def test_the_bundle_runs_from_a_string(bundled):
    import torch
    assert issubclass(bundled["ModelNew"], torch.nn.Module) and callable(bundled["kernel_loss"])
    assert not re.search(r"^\s*from \.|^\s*import crossent", read("model_new.py"), re.M)  # one namespace


@pytest.mark.parametrize("options", [False, True], ids=["default", "options"])
def test_package_and_bundle_build_the_same_source(bundled, options):
    assert bundled["cuda_source"](options) == build.cuda_source(options)
    assert bundled["cpp_source"](options) == build.cpp_source(options)


def test_the_bundle_holds_every_csrc_file(bundled):
    root = os.path.join(ROOT, "crossent", "csrc")
    files = {os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/") for d, _, names in os.walk(root)
             for f in names if f.endswith((".cuh", ".cu", ".cpp"))}
    assert set(bundled["_CSRC"]) == files
    assert all(bundled["csrc_text"](name) == csrc_text(name) for name in files)
    used = {name for options in (False, True) for name in build.CUDA_FILES[options] + build.CPP_FILES[options]}
    assert used == files  # no file the builds leave out


@pytest.mark.parametrize("options", [False, True], ids=["default", "options"])
def test_the_assembly_keeps_every_files_lines(options):
    """After each #line directive the text is the file's, line for line, but for its includes of other
    csrc files and #pragma once, which stand as empty lines, and params.h, which stands where first included."""
    source = build.cuda_source(options) + build.cpp_source(options)
    checked = 0
    for match in re.finditer(r'#line (\d+) "crossent/csrc/([^"]+)"\n', source):
        first, name = int(match.group(1)), match.group(2)
        lines = csrc_text(name).rstrip("\n").split("\n")
        following = source[match.end():].split("\n")
        for k, line in enumerate(lines[first - 1:]):
            got = following[k]
            if got.startswith("#line ") or got.startswith("// params.h, generated"):
                break
            expected = "" if re.match(r'#include "|#pragma once', line) else line
            assert got == expected, (name, first + k)
            checked += 1
    assert checked > 1000


def test_a_file_ahead_of_what_it_includes_is_refused():
    with pytest.raises(ValueError, match="row_end.cuh"):
        build.assemble(["common/arch.cuh", "families/rows.cuh"])


def test_the_default_build_leaves_the_training_families_out():
    default, options = build.cuda_source(False), build.cuda_source(True)
    for kernel in ("cross_entropy_streamed_kernel", "cross_entropy_gradient_kernel", "cross_entropy_fused_kernel",
                   "cross_entropy_scale_kernel", "cross_entropy_round_kernel"):
        assert kernel not in default and kernel in options
    assert "constexpr bool kOptions = false;" in default and "constexpr bool kOptions = true;" in options
