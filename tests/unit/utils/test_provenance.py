"""utils/provenance.py: the commit a run's code came from, and the UTC time, as the run files record them."""

import subprocess
from datetime import datetime, timezone

from iattention.utils.provenance import source_commit, utc_now


def test_outside_a_git_checkout_there_is_no_commit(tmp_path):
    assert source_commit(tmp_path) == dict(commit=None, commit_dirty=None)


def test_a_checkout_s_commit_and_whether_a_tracked_file_differs_from_it(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                       capture_output=True)
    git("init", "-q")
    (tmp_path / "a.txt").write_text("1")
    git("add", "a.txt")
    git("commit", "-q", "-m", "one")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    (tmp_path / "untracked.txt").write_text("x")  # untracked files do not make it dirty
    assert source_commit(tmp_path) == dict(commit=head.strip(), commit_dirty=False)
    (tmp_path / "a.txt").write_text("2")
    assert source_commit(tmp_path) == dict(commit=head.strip(), commit_dirty=True)


def test_utc_now_is_iso_seconds_in_utc():
    t = datetime.strptime(utc_now(), "%Y-%m-%dT%H:%M:%S%z")
    assert t.tzinfo == timezone.utc and abs((datetime.now(timezone.utc) - t).total_seconds()) < 5
