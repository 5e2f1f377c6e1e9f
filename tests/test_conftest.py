"""The suite's own setup (tests/conftest.py): the xdist groups it relies on are really in effect."""

import pytest


@pytest.mark.xdist_group("real-models")
def test_xdist_groups_are_in_effect(request):
    """Under `--dist loadgroup` on workers the node id carries the '@group' suffix the controller schedules
    by (pytest-xdist 3.8 writes it where pytest 9 no longer reads it; conftest writes it where it does)."""
    if not (hasattr(request.config, "workerinput") and request.config.getvalue("loadgroup")):
        pytest.skip("not on a pytest-xdist worker with --dist loadgroup (the default run: python -m pytest)")
    assert request.node.nodeid.endswith("::test_xdist_groups_are_in_effect@real-models"), request.node.nodeid
