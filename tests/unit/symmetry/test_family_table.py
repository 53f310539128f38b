"""docs/conversion.md's table of the families is the one `family_table()` makes from the records and the counts."""

import re
from pathlib import Path

from iattention.config.families import FAMILIES
from iattention.symmetry.counts import family_table

DOC = Path(__file__).resolve().parents[3] / "docs" / "conversion.md"


def test_the_docs_family_table_is_the_generated_one():
    block = re.search(r"<!-- family-table -->\n(.*?)\n<!-- /family-table -->", DOC.read_text(), re.S).group(1)
    assert block == family_table(), ("docs/conversion.md's family table is stale; regenerate it with python -c "
                                     "\"from iattention.symmetry.counts import family_table; print(family_table())\"")


def test_the_table_has_a_row_per_record():
    rows = family_table().splitlines()[2:]
    assert [r.split("|")[1].strip() for r in rows] == list(FAMILIES)
