"""eva_fast: the native (Cython/C++) kernels behind eva.

Never import the kernels directly from eva code: use ``eva._native.load("name")``, which honours
``EVA_PUREPYTHON=1`` and falls back to the numpy reference when the native core is missing.
"""
