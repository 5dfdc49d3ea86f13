"""The install hint for the parts of tinyctx.testing that need hypothesis."""

from __future__ import annotations

__all__ = ["missing_hypothesis"]


def missing_hypothesis(module: str) -> ModuleNotFoundError:
    """The error to raise from ``module`` when hypothesis is not installed."""
    return ModuleNotFoundError(
        f"{module} needs hypothesis (the 'testing' extra): pip install 'tinyctx[testing]'",
        name="hypothesis",
    )
