"""Metrics lines mutation testing changed unnoticed: propensity presets written with separators, and `filter_top_k`
with a missing candidate (-1) before a real id."""

import numpy as np
import pytest

from haste_hf.metrics import (
    AMAZON_PROPENSITY_PARAMETERS,
    DEFAULT_PROPENSITY_PARAMETERS,
    WIKIPEDIA_PROPENSITY_PARAMETERS,
    filter_top_k,
    propensity_parameters,
)


@pytest.mark.parametrize(
    "name, preset",
    [
        ("Wiki-LSHTC", WIKIPEDIA_PROPENSITY_PARAMETERS),
        ("wiki_lshtc_325k", WIKIPEDIA_PROPENSITY_PARAMETERS),
        ("Amazon-Cat-13K", DEFAULT_PROPENSITY_PARAMETERS),
        ("amazon_cat", DEFAULT_PROPENSITY_PARAMETERS),
        ("LF-Amazon-131K", AMAZON_PROPENSITY_PARAMETERS),
    ],
)
def test_propensity_presets_match_names_written_with_separators(name, preset):
    assert propensity_parameters(name) == preset


def test_filter_top_k_skips_a_missing_candidate_before_a_real_one():
    top_ids = np.array([[-1, 5, 3, 8], [4, -1, -1, 2]])
    kept = filter_top_k(top_ids, np.array([[1, 2]]), k=2)
    np.testing.assert_array_equal(kept, [[5, 3], [4, -1]])  # row 1: label 2 is filtered, nothing else is left
