"""`RecipeArguments`' own checks (haste_hf/recipe_arguments.py): a value that would fail deep in the run, or after
it, is refused naming the field, as the arguments are built (the command line's one-line errors are in
tests/cli/test_usage_errors.py)."""

import pytest

from haste_hf.recipe_arguments import RecipeArguments


@pytest.mark.parametrize("name", ["propensity_a", "propensity_b"])
def test_a_propensity_parameter_is_a_positive_number(name):
    """PSP@k's propensity model `1 / (1 + C (N_l + B)^-A)`: A and B must be > 0; 0, a negative and NaN are refused."""
    for value in (0, 0.0, -0.5, float("nan")):
        with pytest.raises(ValueError, match=f"`{name}` must be > 0, got {value}"):
            RecipeArguments(**{name: value})
    assert getattr(RecipeArguments(**{name: 1e-3}), name) == 1e-3
