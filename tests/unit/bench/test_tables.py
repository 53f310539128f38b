"""The benchmark's markdown (`bench/tables.py`): a rerun replaces its own section of BENCHMARKS.md and no
other; the generation table's ratios are against the same model without a cache, with the full cache, and HF at
that head count."""

from iattention.bench.tables import generation_table, replace_section


def test_a_section_is_appended_once_then_replaced_in_place_leaving_the_others(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    replace_section(path, "<!-- bench:cpu:tiny:eager -->", "<!-- bench:cpu:tiny:eager -->\n## A\nold\n")
    assert path.read_text().startswith("# Benchmarks\n")  # a new file gets the page's head
    replace_section(path, "<!-- bench:cuda:paper:eager -->", "<!-- bench:cuda:paper:eager -->\n## B\nkept\n")
    replace_section(path, "<!-- bench:cpu:tiny:eager -->", "<!-- bench:cpu:tiny:eager -->\n## A\nnew\n")
    text = path.read_text()
    assert text.count("<!-- bench:cpu:tiny:eager -->") == 1 and "new" in text and "old" not in text
    assert "## B\nkept" in text
    assert text.index("## A") < text.index("## B")  # replaced where it stood


def test_generation_ratios_are_against_the_same_model_s_other_caches_and_hf_at_its_heads():
    rows = [dict(model="iattention", attention="canonical", n_head=2, kv_cache=True, tokens_per_s=300.0),
            dict(model="iattention", attention="canonical", n_head=2, kv_cache=False, tokens_per_s=100.0),
            dict(model="iattention", attention="standard", n_head=2, kv_cache=False, tokens_per_s=50.0),
            dict(model="hf-gpt2", attention="standard", n_head=2, kv_cache=True, tokens_per_s=150.0),
            dict(model="iattention", attention="canonical", n_head=4, kv_cache=True, tokens_per_s=80.0)]
    lines = generation_table(rows).splitlines()[2:]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    # the last three cells: x no cache, x full cache, x HF generate
    assert cells[0][-3:] == ["3.00", "1.00", "2.00"]  # 300 / 100 without a cache, itself, 300 / 150 HF
    assert cells[1][-3:] == ["1.00", "0.33", "0.67"]
    assert cells[4][-3:] == ["–", "1.00", "–"]  # 4 heads: no uncached run, no HF run to compare with
