# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Device maps: an output layer that a device map offloads (CPU or disk) is hooked as one block, so that its forward
(loss, top-k) finds all its weights. Exported with the modeling file (a sibling, imported with a single dot)."""


def _offload_output_layer_whole(model) -> None:
    """An output layer offloaded by a device map (CPU or disk) gets all its weights for the whole of its forward.

    accelerate hooks an offloaded block module by module, each bringing its own weights for its own forward only;
    the loss and the top-k read the head's and the tail's weights from the layer's forward, where they would still be
    on the meta device. The layer is hooked again as one block that brings them all (accelerate's
    `preload_module_classes`, which `from_pretrained` does not pass)."""
    layer = model.output_layer
    hooks = []
    for module in layer.modules():
        hook = getattr(module, "_hf_hook", None)
        hooks.extend(getattr(hook, "hooks", None) or ([hook] if hook is not None else []))
    offloading = next((hook for hook in hooks if getattr(hook, "offload", False)), None)
    if offloading is None:
        return
    from accelerate.hooks import attach_align_device_hook, remove_hook_from_module

    weights_map = offloading.weights_map
    remove_hook_from_module(layer, recurse=True)
    attach_align_device_hook(
        layer,
        execution_device=offloading.execution_device,
        offload=True,
        weights_map=getattr(weights_map, "dataset", weights_map),
        offload_buffers=offloading.offload_buffers,
        module_name=next(name for name, module in model.named_modules() if module is layer),
        skip_keys=offloading.skip_keys,
        preload_module_classes=[type(layer).__name__],
        tied_params_map=getattr(offloading, "tied_params_map", None),
    )


__all__ = ["_offload_output_layer_whole"]
