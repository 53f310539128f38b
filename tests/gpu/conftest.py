"""Each GPU test's outcome and time printed as it ends, a failure's error lines with it: a GPU window can end
the run before pytest's own summary, and the first window (2026-11-27) then left only `...FFFF` (which tests
failed, and why, was lost)."""

from __future__ import annotations

import pytest

_config = None


def pytest_configure(config):
    global _config
    _config = config  # the terminal reporter is registered after this conftest loads: looked up per report


def _error_lines(text: str, keep: int = 12) -> list[str]:
    """The `E ` lines of a failure (the assertion or exception), else its last lines."""
    lines = text.splitlines()
    errors = [x for x in lines if x.startswith("E ")]
    return (errors or lines)[-keep:]


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    reporter = _config and _config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or not (report.when == "call" or report.failed):
        return
    reporter.write_line(f"[gpu] {report.nodeid} {report.when} {report.outcome} {report.duration:.1f}s")
    if report.failed:
        for line in _error_lines(report.longreprtext):
            reporter.write_line(f"[gpu]   {line[:400]}")
