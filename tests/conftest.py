"""Shared pytest setup: passive OpenMP waiting and deterministic torch before any test imports it."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The endpoint tests serve on 127.0.0.1; a proxy of the machine running the tests (posym's client honours
# HTTP_PROXY / HTTPS_PROXY as urllib does) would otherwise carry those requests away.
os.environ["NO_PROXY"] = os.environ["no_proxy"] = ",".join(
    filter(None, [os.environ.get("NO_PROXY") or os.environ.get("no_proxy"), "127.0.0.1", "localhost"])
)

import pytest  # noqa: E402
import torch  # noqa: E402

# `python -m pytest` runs on two pytest-xdist workers (pyproject's addopts: -n 2 --dist loadgroup). Each
# worker gets an equal share of the cores for torch (the 2-core test machine: one thread each, instead
# of two workers with two threads each fighting over two cores); a single process keeps two threads.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // _WORKERS)))

# Tests that share one worker (xdist_group): the real pretrained models, so that SmolLM2's GGUF is
# dequantized once (posym.models keeps it per process) and the two real models are never loaded and
# run side by side; and the two tests that start a local Ray instance, so that two Ray heads never
# start at once on one machine.
# pytest-xdist 3.8 groups tests by an '@group' suffix of the node id, which it writes to item._nodeid;
# pytest 9 keeps node ids in item._id, so that write is lost and groups were silently not in effect (the
# real models ran on both workers). pytest_collection_modifyitems below writes the suffix where pytest 9
# reads it; test_cli_conventions::test_xdist_groups_are_in_effect fails if the groups lapse again.
REAL_MODEL_FIXTURES = {"smollm2", "gemma3"}  # tests/test_real_model.py, test_gemma3.py, test_pruning.py
REAL_MODEL_TESTS = {"tests/test_llm_study.py::test_real_model_study"}  # loads smollm2-135m itself
RAY_TESTS = {
    "tests/test_sweep.py::test_two_trials_on_local_ray",
    "tests/test_reliability.py::test_sweep_killed_then_rerun_skips_finished_trials_and_equals_uninterrupted",
}


# Module-scoped fixtures that are slow to build: the tests using one run on one worker, which builds it
# once (on two workers each built its own: both setups showed in --durations).
SHARED_FIXTURES = {
    "tests/test_run.py": ("finished", "pipeline"),  # a finished `posym run` of both tasks (~50 s)
    "tests/test_llm_study.py": ("finished", "llm-study"),  # a finished llm-study on a tiny llama (~20 s)
}


def xdist_group_of(item) -> str | None:
    """The xdist group a collected test runs in, or None (any worker)."""
    node = item.nodeid.split("[")[0]
    if node in REAL_MODEL_TESTS or REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
        return "real-models"
    if node in RAY_TESTS:
        return "ray"
    module = node.split("::")[0]
    if module in SHARED_FIXTURES and SHARED_FIXTURES[module][0] in getattr(item, "fixturenames", ()):
        return SHARED_FIXTURES[module][1]
    return None


@pytest.hookimpl(tryfirst=True)  # before -m / -k deselect: `items` is every collected test
def pytest_collection_modifyitems(config, items):
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS:  # the whole suite was collected
        known = {item.nodeid.split("[")[0] for item in items}
        missing = (REAL_MODEL_TESTS | RAY_TESTS) - known  # a renamed test would silently lose its group
        assert not missing, f"conftest names tests that do not exist: {sorted(missing)}"
    _suffix_groups(config, items)


def pytest_itemcollected(item):
    """The group marker goes on as each test is collected, before any collection_modifyitems hook."""
    group = xdist_group_of(item)
    if group:
        item.add_marker(pytest.mark.xdist_group(group))


def _suffix_groups(config, items) -> None:
    """On an xdist worker with --dist loadgroup: the '@group' node-id suffix the controller schedules by."""
    if not (hasattr(config, "workerinput") and config.getvalue("loadgroup")):
        return
    from _pytest.nodeid import coerce_node_id  # pytest >= 9 (the node id's structured form)

    for item in items:
        groups = sorted(
            {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
        )
        if groups and "@" not in item.nodeid:
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(groups)}")
