"""The text of the CUDA and C++ sources under csrc/, which build.py assembles for load_inline.
model_new.py, the single-file bundle, holds the same files as string literals in this module's place
(tools/bundle.py), so that the package and the bundle hand load_inline the same text."""
from importlib import resources


def csrc_text(name):
    """The text of csrc/<name>, e.g. "common/lse.cuh"."""
    return (resources.files(__package__) / "csrc" / name).read_text()
