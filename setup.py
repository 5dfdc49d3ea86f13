"""The optional C reader (tinyctx._speedups): everything else is declared in pyproject.toml.

``optional=True``: where no C compiler is found the package installs without it, and the
codec's Python reader decodes everything (the same results, slower on long threads).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tinyctx._speedups", ["tinyctx/_speedups.c"], optional=True)])
