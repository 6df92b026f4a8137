"""Tail supports edited out of range are refused however they were edited: through `.data`, or of a buffer made
under `torch.inference_mode()` (as a load there makes it), the buffer's version does not change, and the check, run once per version, let them through
(the kernels would read outside the features). On a CPU they are checked at each use; on accelerators once per
version (a check is a device sync), and at each use with `HASTE_HF_VALIDATE=1`."""

import pytest
import torch

from haste_hf.modeling import label_positions
from haste_hf.modeling.output_layer import HasteOutputLayer


OUT_OF_RANGE = r"`tail.supports` holds feature indices in \[-?\d+, -?\d+\], outside \[0, 16\)"


def edit_data(layer, value):
    layer.tail.supports.data[1, 0] = value


def edit_inference_tensor(layer, value):
    if not layer.tail.supports.is_inference():  # made in inference mode (as by a load there): it keeps no version
        with torch.inference_mode():
            layer.tail.supports = layer.tail.supports.clone()
    with torch.inference_mode():
        layer.tail.supports[1, 0] = value


EDITS = [edit_data, edit_inference_tensor]


def layer_and_features():
    torch.manual_seed(0)
    return HasteOutputLayer(16, 30, 2, 4, 8), torch.randn(3, 16)


@pytest.mark.parametrize("edit", EDITS)
@pytest.mark.parametrize("value", [16, -1])
def test_supports_edited_past_the_version_counter_are_refused_on_a_cpu(edit, value):
    layer, features = layer_and_features()
    original = layer.tail.supports[1, 0].item()
    edit(layer, original)  # an inference tensor from here on, where `edit` makes one
    expected = layer.topk(features, 3).label_ids  # checked once: the version is now the checked one
    edit(layer, value)
    for use in (lambda: layer.topk(features, 3), lambda: layer.logits(features), lambda: layer(features, top_k=3)):
        with pytest.raises(ValueError, match=OUT_OF_RANGE):
            use()
    edit(layer, original)  # repaired: served again
    assert torch.equal(layer.topk(features, 3).label_ids, expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("edit", EDITS)
def test_on_a_gpu_such_edits_are_refused_with_validation(monkeypatch, edit):
    monkeypatch.setattr(label_positions, "VALIDATE_LABELS", True)
    layer, features = layer_and_features()
    layer, features = layer.cuda(), features.cuda()
    layer.topk(features, 3)
    edit(layer, 16)
    with pytest.raises(ValueError, match=OUT_OF_RANGE):
        layer.topk(features, 3)
