"""A switch on modules for the length of a block (attention layers' weights_frozen, RMSNorm's exact)."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def switched_on(objects, name: str):
    """Set attribute `name` True on each of `objects` inside the block, and False after it (an error too)."""
    objects = list(objects)
    for o in objects:
        setattr(o, name, True)
    try:
        yield
    finally:
        for o in objects:
            setattr(o, name, False)
