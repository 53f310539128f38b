"""Unit tests of iattention.utils.atomic."""

import os

import pytest


def test_a_250_byte_name_can_be_written(tmp_path):
    """Before: the temp name `.NAME.PID.xxxx.tmp` beside a legal 250-byte name was too long (ENAMETOOLONG)."""
    from iattention.utils.atomic import write_text

    target = tmp_path / ("a" * 250)
    write_text(target, "table\n")
    write_text(target, "table 2\n")
    assert target.read_text() == "table 2\n" and os.listdir(tmp_path) == ["a" * 250]


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_respect_the_umask(tmp_path, umask, mode):
    """Before: every atomically written file was 0600 (mkstemp's mode) whatever the umask."""
    from iattention.utils.atomic import write_text
    from iattention.utils.lock import RunLock

    old = os.umask(umask)
    try:
        write_text(tmp_path / "report.md", "x\n")
        RunLock(tmp_path / "run").acquire().release()
    finally:
        os.umask(old)
    assert (tmp_path / "report.md").stat().st_mode & 0o777 == mode
    assert (tmp_path / "run" / ".lock").stat().st_mode & 0o777 == mode
