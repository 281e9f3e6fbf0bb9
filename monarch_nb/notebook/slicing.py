"""Check a slice against a mesh's named dims before handing it to Monarch."""

from __future__ import annotations

from ..errors import SliceError


def validate_slice(mesh_name: str, shape: dict[str, int], selectors: dict[str, int | slice]) -> dict[str, int | slice]:
    dims = " × ".join(f"{k}={v}" for k, v in shape.items())
    for dim, index in selectors.items():
        if dim not in shape:
            raise SliceError(f"mesh {mesh_name!r} has no dim {dim!r}; its shape is {dims}")
        size = shape[dim]
        if isinstance(index, int):
            if not 0 <= index < size:
                raise SliceError(f"{dim}={index} is outside mesh {mesh_name!r} (shape {dims}; {dim} is 0..{size - 1})")
        else:
            if range(size)[index] == range(0):
                raise SliceError(f"{dim}={index.start}:{index.stop} selects nothing in mesh {mesh_name!r} (shape {dims})")
            for bound in (index.start, index.stop):
                if bound is not None and not 0 <= bound <= size:
                    raise SliceError(f"{dim} bound {bound} is outside mesh {mesh_name!r} (shape {dims})")
    return selectors
