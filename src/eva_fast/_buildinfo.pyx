# cython: language_level=3
"""Facts about how the native core was compiled."""

cdef extern from "buildinfo.hpp" namespace "eva":
    const char* compiler_id()
    int cxx_standard()


def build_info() -> dict:
    return {"compiler": compiler_id().decode(), "cxx_standard": cxx_standard()}
