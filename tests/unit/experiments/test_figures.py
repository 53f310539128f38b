"""Unit tests of iattention.experiments.figures: how arms are told apart."""

from __future__ import annotations

from iattention.experiments.figures import COLORS, REFERENCE, arm_styles

STUDY = ["standard-rmslr", "canonical", "canonical-ep40", "canonical-lr0.5x", "canonical-lr2x", "canonical-matched",
         "canonical-matched-lr0.5x", "canonical-matched-lr2x", "canonical-matched-muon",
         "canonical-matched-nowd-attn", "canonical-matched-rmslr", "canonical-matched-rmslr-iso", "canonical-rmslr",
         "identity_ko", "identity_ko-rmslr", "identity_q", "standard", "standard-ep40", "standard-lr0.5x",
         "standard-lr2x", "standard-muon", "standard-nowd-attn"]  # results/cpu-study's 22 arms


def test_every_arm_of_a_22_arm_study_has_its_own_colour_and_marker_and_the_reference_is_always_black_squares():
    styles = arm_styles(STUDY, "standard-rmslr")
    pairs = [(s.color, s.marker) for s in styles.values()]
    assert len(set(pairs)) == len(STUDY) == 22
    assert styles["standard-rmslr"] == REFERENCE and styles["standard-muon"] != REFERENCE
    assert [a for a, s in styles.items() if s.color == REFERENCE.color] == ["standard-rmslr"]
    # the reference is drawn the same way whatever its name, place and company; the usual arms keep theirs
    for arms, ref in ((STUDY[::-1], "standard-muon"), (["x", "canonical"], "x"),
                      (["standard", "canonical"], "standard")):
        assert arm_styles(arms, ref)[ref] == REFERENCE
    assert arm_styles(["standard", "canonical"], "standard")["canonical"].marker == "o"
    assert styles["canonical"].color != styles["canonical-matched"].color != COLORS["standard"]
    # without a reference, colours are used once each before any repeats with another marker
    nine = arm_styles([f"arm{i}" for i in range(9)])
    assert len({s.color for s in nine.values()}) == 9
