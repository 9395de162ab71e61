"""The optional compiled hot path; everything else about the package is in pyproject.toml.

Each extension is ``optional``: where no C compiler is found the install still succeeds and
tfrecordd runs its pure-Python implementation of the same functions (``tfrecordd.speedups``).
"""

from setuptools import Extension, setup

_FLAGS = ["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"]

setup(
    ext_modules=[
        Extension(
            "tfrecordd._cframe",
            ["daemon/tfrecordd/_cframe.c"],
            extra_compile_args=_FLAGS,
            optional=True,
        ),
        Extension(
            "tfrecordd._cexample",
            ["daemon/tfrecordd/_cexample.c"],
            extra_compile_args=_FLAGS,
            optional=True,
        ),
    ]
)
