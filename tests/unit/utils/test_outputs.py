"""Unit tests of iattention.utils.outputs: the list of what figure commands wrote into a folder."""

import pytest

from helpers import tells
from iattention.errors import UserError
from iattention.utils.outputs import WRITTEN, claim_outputs


def never(_path) -> bool:
    return False


def test_commands_sharing_a_folder_keep_each_other_s_files_listed_so_a_rerun_is_not_refused(tmp_path):
    """`iattn inspect RUN --out F`, then `iattn lab ... --out F`: the second keeps the first's names on the list, so
    inspect run again rewrites its own files (a list of the last command's names alone refused the rerun, and
    then the lab rerun after it); a user's file there stays refused."""
    out = tmp_path / "figs"
    inspect, lab = ["spectra.md", "spectra.png"], ["copy_task.json", "copy_task.png"]
    for names in (inspect, lab, inspect, lab):
        claim_outputs(out, names, never)
        for name in names:
            (out / name).write_text("ours")
    assert set((out / WRITTEN).read_text().split()) == {*inspect, *lab}
    (out / "notes.md").write_text("mine")
    with pytest.raises(UserError) as err:
        claim_outputs(out, ["notes.md"], never)
    tells(err, str(out / "notes.md"), WRITTEN, "--out")
