"""Test support that users can import too: tolerances and hypothesis strategies."""
from .tolerances import TOLERANCES, tolerance, assert_close, relative_error  # noqa: F401
