"""Run-relative unit paths as the producers' default picks and resume calls use them (``/``-separated)."""

from __future__ import annotations

__all__ = ["parent", "base", "join", "folders_up"]


def parent(unit: str) -> str:
    """The folder of ``unit`` ("" at the run's root)."""
    return unit.rsplit("/", 1)[0] if "/" in unit else ""


def base(unit: str) -> str:
    """The last component of ``unit``."""
    return unit.rsplit("/", 1)[-1]


def join(run_dir: str, rel: str) -> str:
    """``rel`` under ``run_dir`` (``run_dir`` itself for "" or "."; ``rel`` alone when ``run_dir`` is "")."""
    if not rel or rel == ".":
        return run_dir.rstrip("/") or "."
    return f"{run_dir.rstrip('/')}/{rel}" if run_dir else rel


def folders_up(unit: str):
    """``unit`` and each folder above it inside the run, innermost first (``a/b/c`` → ``a/b/c``, ``a/b``, ``a``)."""
    cur = unit
    while cur and cur != ".":
        yield cur
        cur = parent(cur)
