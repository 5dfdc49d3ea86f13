"""The optional C modules (tinyctx._speedups, the codec's reader; tinyctx._token_speedups,
a cold count's loop): everything else is declared in pyproject.toml.

``optional=True``: where no C compiler is found the package installs without them, and the
Python code does everything (the same results, slower on long threads). The counting loop
is built without fused multiply-adds, so its floating-point sums round as Python's do.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("tinyctx._speedups", ["tinyctx/_speedups.c"], optional=True),
        Extension(
            "tinyctx._token_speedups",
            ["tinyctx/_token_speedups.c"],
            depends=["tinyctx/_token_scan.h"],
            extra_compile_args=["-ffp-contract=off"],
            optional=True,
        ),
    ]
)
