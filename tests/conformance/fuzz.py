"""Hypothesis strategies for bad request bodies, shared by every route's fuzz test."""

from __future__ import annotations

import json

from hypothesis import strategies as st

_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
json_values = st.recursive(
    _scalars,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3),
    max_leaves=8,
)


def _dumps(value: object) -> bytes:
    return json.dumps(value).encode()  # stdlib: huge integers included


def bodies(*fields: str) -> st.SearchStrategy[bytes]:
    """Raw bytes (invalid UTF-8 included), arbitrary JSON, and objects with ``fields`` of any type."""
    return st.one_of(
        st.binary(max_size=64),
        json_values.map(_dumps),
        st.fixed_dictionaries({f: json_values for f in fields}).map(_dumps),
        st.fixed_dictionaries({f: json_values for f in fields if f != "model"},
                              optional={"model": st.just("smollm2:135m")}).map(_dumps),
    )
