"""Unit tests of iattention.lab.trained_attention."""




def test_head_colours_differ_for_every_head():
    from iattention.lab.trained_attention import head_colors

    for n in (1, 4, 12, 25):
        assert len({tuple(c) for c in head_colors(n)}) == n


def test_two_runs_checkpoints_of_one_name_are_told_apart_by_their_folders(tmp_path):
    from iattention.lab.trained_attention import run_names

    for d in "ab":
        (tmp_path / d / "r").mkdir(parents=True)
        (tmp_path / d / "r" / "best.safetensors").touch()
    assert run_names([str(tmp_path / d / "r" / "best.safetensors") for d in "ab"]) == ["a-r-best", "b-r-best"]
    assert run_names([str(tmp_path / "a" / "r"), str(tmp_path / "b")]) == ["r", "b"]  # no clash: the names alone
