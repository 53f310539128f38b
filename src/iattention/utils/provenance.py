"""When a run ran and on which code: the UTC time now, and the git commit of the source tree this package runs
from (with whether tracked files differ from it), so a run's files say their own order and code."""

from __future__ import annotations

import subprocess
from datetime import datetime, timezone
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1]  # src/iattention: the package's own folder


def utc_now() -> str:
    """e.g. '2026-11-28T03:41:07Z' (seconds)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _git(where: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=20,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def source_commit(where: Path = SOURCE) -> dict:
    """{"commit": the HEAD of the git checkout holding `where` (None outside one, or without git),
    "commit_dirty": whether tracked files differ from it (None when there is no commit)}."""
    head = _git(where, "rev-parse", "HEAD")
    if not head:
        return dict(commit=None, commit_dirty=None)
    changed = _git(where, "status", "--porcelain", "--untracked-files=no")
    return dict(commit=head.strip(), commit_dirty=None if changed is None else bool(changed.strip()))
