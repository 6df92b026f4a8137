"""Head label ids given as an empty list are an empty head, as `head_labels=0` is (they were refused as "a number of
labels, head label ids or a LabelLayout", which an empty list of ids is); ids of the wrong kind stay refused."""

import numpy as np
import pytest
import torch

from haste_hf.modeling.output_layer import HasteOutputLayer


@pytest.mark.parametrize("empty", [[], (), np.array([]), torch.tensor([]), torch.tensor([], dtype=torch.int64)])
def test_no_head_ids_is_the_layer_without_a_head(empty):
    torch.manual_seed(0)
    layer = HasteOutputLayer(32, 30, empty, 4, 8)
    torch.manual_seed(0)
    headless = HasteOutputLayer(32, 30, 0, 4, 8)
    assert layer.head is None and layer.head_label_count == 0
    assert torch.equal(layer.output_labels, headless.output_labels)
    features = torch.randn(6, 32)
    assert torch.equal(layer.logits(features), headless.logits(features))


@pytest.mark.parametrize("ids", [[1.5], [True, False], 2.5])
def test_head_ids_of_the_wrong_kind_stay_refused(ids):
    with pytest.raises(ValueError, match="`head_labels` must be a number of labels"):
        HasteOutputLayer(32, 30, ids, 4, 8)
