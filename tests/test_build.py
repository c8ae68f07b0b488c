"""The build as a user meets it, load_inline stubbed: one line on stderr when a build starts and none
when it is cached, a finished build imported as it is (load_inline not called), builds of one extension
in turn across processes, and a build lock that a dead build left taken over."""
import os
import subprocess
import sys
import time
import types

import pytest

from crossent import build

TARGETS = (("90", "sm_90"),)


@pytest.fixture
def extensions(tmp_path, monkeypatch):
    """Builds into tmp_path, each recorded instead of compiled: its "library" a Python file that names
    the build, returned loaded as load_inline returns its module."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    built = []

    def load_inline(name, **kwargs):
        built.append(name)
        library = tmp_path / name / f"{name}.py"
        library.write_text(f"BUILT = {len(built)}\n")
        return types.SimpleNamespace(__file__=str(library), BUILT=len(built))

    monkeypatch.setattr(build, "load_inline", load_inline)
    return tmp_path, built


def test_a_build_says_so_and_a_cached_one_is_silent(extensions, capsys):
    root, built = extensions
    assert build._build(TARGETS).BUILT == 1
    line = capsys.readouterr().err
    assert line.startswith("crossent: building the default kernels for sm_90, once") and str(root) in line
    assert "MAX_JOBS" in line and "TORCH_EXTENSIONS_DIR" in line
    cached = build._build(TARGETS)  # the finished build, imported: no load_inline, so no ninja
    assert capsys.readouterr().err == "" and cached.BUILT == 1 and cached.__file__.endswith("crossent_sm_90.py")
    build._build(TARGETS, options=True)
    assert "building the options kernels" in capsys.readouterr().err
    assert built == ["crossent_sm_90", "crossent_sm_90_options"]


def test_a_build_is_redone_where_its_arguments_or_library_changed(extensions, capsys, monkeypatch):
    root, built = extensions
    build._build(TARGETS)
    monkeypatch.setattr(build, "cuda_source", lambda options=False: "// another source")
    assert build._build(TARGETS).BUILT == 2  # another digest
    (root / "crossent_sm_90" / "crossent_sm_90.py").unlink()
    assert build._build(TARGETS).BUILT == 3  # the stamp's library gone
    (root / "crossent_sm_90" / "crossent.stamp").write_text("a stamp of an older form")
    assert build._build(TARGETS).BUILT == 4
    assert capsys.readouterr().err.count("building the default kernels") == 4


def test_a_lock_left_by_a_dead_build_is_taken_over(extensions, capsys):
    root, built = extensions
    (root / "crossent_sm_90").mkdir()
    (root / "crossent_sm_90" / "lock").write_text("")  # torch's, from a build killed midway
    build._build(TARGETS)
    assert "removing" in capsys.readouterr().err and not (root / "crossent_sm_90" / "lock").exists()
    assert built == ["crossent_sm_90"]


@pytest.mark.skipif(os.name != "posix", reason="flock is POSIX")
def test_concurrent_builds_wait_for_the_live_one(extensions):
    """Another process holding the build's lock (alive, building) is waited for, and its torch lock
    left alone until it is done."""
    root, built = extensions
    directory = root / "crossent_sm_90"
    directory.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", f"""
import fcntl, os, time
with open({str(directory / 'crossent.lock')!r}, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    open({str(directory / 'lock')!r}, "w").close()
    print("held", flush=True)
    time.sleep(1.0)
    os.remove({str(directory / 'lock')!r})
"""], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    start = time.perf_counter()
    build._build(TARGETS)
    assert time.perf_counter() - start > 0.5 and holder.wait() == 0
    assert built == ["crossent_sm_90"]
