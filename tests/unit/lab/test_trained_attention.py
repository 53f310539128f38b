"""Unit tests of iattention.lab.trained_attention."""


def test_head_colours_differ_for_every_head():
    from iattention.lab.trained_attention import head_colors

    for n in (1, 4, 12, 25):
        assert len({tuple(c) for c in head_colors(n)}) == n
