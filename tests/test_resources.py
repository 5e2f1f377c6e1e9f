"""posym.resources: the parameter count behind the memory estimate, and refusals before any allocation."""

import pytest

from posym.errors import PosymError
from posym.commands.train import resolve_config
from posym.core.model import ModelConfig, build_model
from posym.resources import check_resources, memory_estimate, parameter_count


@pytest.mark.parametrize(
    "shape",
    [
        dict(n_layer=2, n_head=1, n_embd=32),
        dict(n_layer=3, n_head=4, n_embd=48, mlp_ratio=2),
        dict(n_layer=1, n_head=2, n_embd=16, rotary_dim=4),
    ],
)
def test_parameter_count_equals_the_built_model(shape):
    config = ModelConfig(**shape, n_positions=64)
    model = build_model(config, 30, seed=0)
    assert parameter_count(config, 30) == sum(p.numel() for p in model.parameters())


def test_estimate_grows_with_the_shape_and_refuses_what_the_machine_cannot_hold():
    small = resolve_config("quick", "number")
    wide = resolve_config("quick", "number", overrides={"model": {"n_embd": 10_000_000}})
    assert memory_estimate(wide) > 1000 * memory_estimate(small)
    assert check_resources(small) == "cpu"
    with pytest.raises(PosymError, match="GiB to train"):
        check_resources(wide)
