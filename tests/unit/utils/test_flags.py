"""utils/flags.py: a switch on for the length of a block, off after it, an error too."""

import types

import pytest

from iattention.utils.flags import switched_on


def test_a_switch_is_on_inside_the_block_and_off_after_it_even_after_an_error():
    objs = [types.SimpleNamespace(exact=False) for _ in range(3)]
    with switched_on(iter(objs), "exact"):  # a generator: read once, switched back all the same
        assert all(o.exact for o in objs)
    assert not any(o.exact for o in objs)
    with pytest.raises(KeyError), switched_on(objs, "exact"):
        raise KeyError("x")
    assert not any(o.exact for o in objs)
