"""Errors the controller raises: each names what went wrong and what to do about it."""

from __future__ import annotations

from typing import Any


class MonarchNbError(Exception):
    """Base class for monarch_nb errors."""


def format_ranks(ranks: "list[int] | set[int]", limit: int = 8) -> str:
    """Ranks as a person reads them: ``[1-3, 7]``; a long list as a count and its span."""
    ordered = sorted(set(ranks))
    if not ordered:
        return "[]"
    spans: list[str] = []
    start = prev = ordered[0]
    for r in ordered[1:] + [None]:  # type: ignore[list-item]
        if r is not None and r == prev + 1:
            prev = r
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    if len(spans) <= limit:
        count = f" ({len(ordered)} ranks)" if len(ordered) > 2 * limit else ""
        return "[" + ", ".join(spans) + "]" + count
    return f"{len(ordered)} ranks ({ordered[0]}..{ordered[-1]}, in {len(spans)} runs)"


class UnknownMeshError(MonarchNbError, KeyError):
    def __init__(self, name: str, known: list[str], what: str = "mesh") -> None:
        self.name, self.known = name, known
        listing = ", ".join(sorted(known)) if known else f"none (start one with %monarch up)"
        super().__init__(f"no {what} named {name!r}; known {what}es: {listing}")

    def __str__(self) -> str:  # KeyError would add quotes
        return self.args[0]


class SliceError(MonarchNbError, ValueError):
    """A slice that does not fit the mesh; names the mesh's shape."""


class CallTimeout(MonarchNbError, TimeoutError):
    """Some ranks did not answer before the deadline; ``partial`` holds the answers that came."""

    def __init__(self, endpoint: str, missing_ranks: list[int], timeout: float,
                 partial: dict[int, Any] | None = None, failed_ranks: list[int] | None = None) -> None:
        self.endpoint = endpoint
        self.missing_ranks = missing_ranks
        self.failed_ranks = failed_ranks or []
        self.timeout = timeout
        self.partial = partial or {}
        dead = f" (known failed: {format_ranks(self.failed_ranks)})" if self.failed_ranks else ""
        super().__init__(
            f"{endpoint}: ranks {format_ranks(missing_ranks)} did not answer within {timeout:g} s{dead}; "
            "check `%monarch status`, replace a failed mesh with `%monarch replace NAME`, "
            "or pass a longer timeout"
        )


class RemoteError(MonarchNbError):
    """One or more ranks raised; ``errors`` maps rank -> exception, ``results`` the rest."""

    def __init__(self, endpoint: str, errors: dict[int, BaseException], results: dict[int, Any]) -> None:
        self.endpoint, self.errors, self.results = endpoint, errors, results
        first_rank = min(errors)
        super().__init__(
            f"{endpoint} raised on ranks {format_ranks(errors)}; rank {first_rank}: "
            f"{type(errors[first_rank]).__name__}: {errors[first_rank]}"
        )


class CallInterrupted(KeyboardInterrupt):
    """Ctrl-C ended the wait for a call. ``result`` holds what arrived (a ``MeshResult``); its
    ``missing`` ranks had not answered. A KeyboardInterrupt, so a notebook stops where it is."""

    def __init__(self, endpoint: str, result: Any) -> None:
        self.endpoint, self.result = endpoint, result
        waiting = f"; ranks {format_ranks(result.missing)} had not answered" if result.missing else ""
        super().__init__(f"{endpoint}: interrupted after {result.seconds:.1f} s{waiting}")


class Interrupted(KeyboardInterrupt):
    """A notebook command was interrupted; the message says what stopped and what still runs.
    The Monarch kernel shows it as one line, not a traceback."""
