"""Hypothesis strategies more than one test module draws from."""

from __future__ import annotations

from hypothesis import strategies as st

__all__ = ["json_scalars"]


def json_scalars(max_text: int) -> st.SearchStrategy[object]:
    """Any JSON scalar: null, a boolean, an integer past 64 bits, a finite float, a short string."""
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=max_text),
    )
