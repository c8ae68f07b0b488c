"""The host-device boundary: one parameter block, declared once in _PARAMS. The C++ compiler must
lay out the generated `struct Params` exactly as the dispatch packs it (CPU-only: nvcc)."""
import os
import re
import shutil
import subprocess

import pytest

import model_new

NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


def packed_offsets():
    """Each field's offset in _PARAMS_STRUCT's layout, and the block's size."""
    codes = [code for _, _, code, _ in model_new._PARAMS]
    offsets = [model_new.struct.calcsize("@" + "".join(codes[:k + 1])) - model_new.struct.calcsize("@" + codes[k])
               for k in range(len(codes))]
    return offsets, model_new._PARAMS_STRUCT.size


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_the_compiler_lays_out_params_as_the_dispatch_packs_them(tmp_path):
    names = [name for name, *_ in model_new._PARAMS]
    src = tmp_path / "layout.cu"
    src.write_text(model_new._cuda_preamble() + "#include <cstddef>\n#include <cstdio>\nint main() {\n"
                   + "".join(f'  std::printf("%zu\\n", offsetof(Params, {n}));\n' for n in names)
                   + '  std::printf("%zu\\n", sizeof(Params));\n}\n')
    exe = tmp_path / "layout"
    proc = subprocess.run([NVCC, "-std=c++17", str(src), "-o", str(exe)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    *offsets, size = [int(v) for v in subprocess.run([str(exe)], capture_output=True, text=True).stdout.split()]
    assert (offsets, size) == packed_offsets()


def test_every_field_is_packed_by_name():
    """The dispatch builds the block by field name (_Params), so a field it omits or misspells is an
    error, not a shifted block; each value must fit its struct code."""
    fields = dict.fromkeys(model_new._Params._fields, 1)
    block = model_new._PARAMS_STRUCT.pack(*model_new._Params(**fields))
    assert len(block) == model_new._PARAMS_STRUCT.size
    with pytest.raises(TypeError):
        model_new._Params(**{k: v for k, v in fields.items() if k != "grid"})
    with pytest.raises(model_new.struct.error):
        model_new._PARAMS_STRUCT.pack(*model_new._Params(**dict(fields, group=2**40)))


def test_the_dispatch_names_every_field():
    """_cross_entropy fills the block with every field of _PARAMS, each named once."""
    import inspect
    source = inspect.getsource(model_new._cross_entropy)
    call = source[source.index("_Params("):source.index(".launch(")]
    named = re.findall(r"\b(\w+)=", call)
    assert sorted(named) == sorted(name for name, *_ in model_new._PARAMS)


def test_the_binding_declares_what_the_cuda_source_defines():
    decl = re.search(r"void launch_cross_entropy\(([^)]*)\);", model_new._CPP_SRC).group(1)
    defn = re.search(r"void launch_cross_entropy\(([^)]*)\) \{", model_new._CUDA_SRC).group(1)
    assert " ".join(decl.split()) == " ".join(defn.split())


def test_the_kernels_see_the_policys_constants():
    preamble = model_new._cuda_preamble()
    for name, value in model_new._KERNEL_CONSTANTS.items():
        assert f"constexpr int {name} = {value};" in preamble
    assert not re.search(r"-D\w+=", " ".join(model_new._nvcc_flags(["-arch=sm_90"])))  # no other way in
