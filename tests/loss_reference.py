"""The float64 reference of the output layer's loss, and the random layers and positives it is checked on
(the loss tests and the memory tests share them)."""

import torch
import torch.nn.functional as F


def make_layer(kind, batch, features, outputs, dtype, device="cpu", group_size=4, fan_in=3, bias=True, seed=0):
    """(x, weight, bias, supports) of a dense [outputs, d] or group-sparse [outputs / G, G, F] layer."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, features, generator=generator)
    if kind == "dense":
        weight = torch.randn(outputs, features, generator=generator) / features**0.5
        supports = None
    else:
        groups = outputs // group_size
        weight = torch.randn(groups, group_size, fan_in, generator=generator) / fan_in**0.5
        supports = torch.stack([torch.randperm(features, generator=generator)[:fan_in] for _ in range(groups)]).int()
        supports = supports.to(device)
    bias_tensor = torch.randn(outputs, generator=generator) if bias else None
    cast = [t.to(device, dtype) if t is not None else None for t in (x, weight, bias_tensor)]
    return (*cast, supports)


def random_positions(batch, outputs, positives=5, seed=1):
    """Positions with -1 padding, repeats, and entries past the layer (padding slots, another layer)."""
    generator = torch.Generator().manual_seed(seed)
    positions = torch.randint(-1, outputs + 4, (batch, positives), generator=generator)
    positions[0, 1] = positions[0, 0]  # a repeat counts once
    positions[-1] = -1  # an example without positives
    return positions


def dense_targets(positions, valid_count):
    """0/1 targets `[B, valid_count]`, built element by element (independent of `targets_of_chunk`)."""
    targets = torch.zeros(positions.shape[0], valid_count, dtype=torch.float64)
    for row, ids in enumerate(positions.tolist()):
        for position in ids:
            if 0 <= position < valid_count:
                targets[row, position] = 1.0
    return targets


def reference(x, weight, bias, supports, positions, valid_count, scale, loss):
    """Loss and gradients (x, weight, bias) of the materialised logits, in float64, by autograd."""
    leaves = [t.detach().double().requires_grad_() if t is not None else None for t in (x, weight, bias)]
    x64, w64, b64 = leaves
    if supports is None:
        logits = x64 @ w64.t()
    else:
        logits = torch.einsum("bkf,kgf->bkg", x64[:, supports.long()], w64).reshape(x.shape[0], -1)
    if b64 is not None:
        logits = logits + b64
    logits = logits[:, :valid_count]
    targets = dense_targets(positions.cpu(), valid_count).to(logits.device)
    if loss == "bce":
        terms = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    else:
        terms = torch.clamp(1.0 - (2.0 * targets - 1.0) * logits, min=0.0) ** 2
    value = terms.sum() * scale
    value.backward()
    return value.detach(), [leaf.grad if leaf is not None else None for leaf in leaves]
