# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Folders of a label-sharded run, saved and loaded without gathering the output layer on one process.

At 10^9 labels the output layer fits no single host (256 GB of bf16 tail weights, as much again of momentum): every
rank writes its own rows of it (and, in a checkpoint, their optimizer state) into a file of its own, and reads back
the rows it owns (`haste_hf.modeling.output_shards` describes the files). A save is collective: rank 0 makes the
save's staging folder inside the target (`save_folder_atomically`), every rank writes its shard into it, rank 0
writes the rest (the other weights, configuration, label names, the shards' index, the tokenizer) and switches the
whole folder in at once; a failure on any rank fails the save on every rank and leaves the folder as it was. The
staging folder must be one all ranks can write: one host, or a file system every host shares.

Every sharded run saves this way, checkpoints and the final model alike: one code path, the one 10^9 labels needs,
tested at any size; `HasteForExtremeClassification.from_pretrained` reassembles such a folder in one process.
"""

import json
import math
import os
import stat
import warnings

import torch
import torch.distributed as dist

from ..modeling.label_names import label_names_file, name_file_tensors
from ..modeling.logging_utils import get_logger
from ..modeling.output_shards import (
    LABEL_ID_TENSORS,
    OUTPUT_SHARDS_FORMAT,
    OUTPUT_SHARDS_INDEX,
    ROW_SHARDED_TENSORS,
    OutputShards,
    is_plain_file_name,
    optimizer_entry_name,
    output_shard_file,
    row_range,
)
from ..modeling.saving import check_finite_weights, save_folder_atomically
from .distributed import balanced_ranges, broadcast_object


logger = get_logger(__name__)

# Bytes of one piece a rank writes or reads at a time: the host never holds a whole share (64 GB at 10^9 labels).
_PIECE_BYTES = 1 << 28
_SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
# optimizer.pt of a sharded checkpoint: which state entries of the output optimizer are in the shards (by index).
ROWS_IN_SHARDS_KEY = "output_rows_in_shards"


def layer_prefix(model) -> str:
    """The state-dict name of `model`'s output layer, with its dot."""
    return next(name + "." for name, module in model.named_modules() if module is model.output_layer)


def _rows_per_piece(tensor: torch.Tensor) -> int:
    return max(1, _PIECE_BYTES // max(1, tensor.element_size() * math.prod(tensor.shape[1:])))


def write_safetensors(path: str, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """Writes `tensors` (on any device) as a safetensors file, piece by piece: `safetensors.torch.save_file` would
    copy all of them to the host first."""
    header, offset = {}, 0
    for name, tensor in tensors.items():
        if tensor.dtype not in _SAFETENSORS_DTYPES:
            raise ValueError(f"{name}: safetensors holds no {tensor.dtype}.")
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape)}
        header[name]["data_offsets"] = [offset, offset + size]
        offset += size
    if metadata:
        header["__metadata__"] = metadata
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(encoded).to_bytes(8, "little"))
        f.write(encoded)
        for tensor in tensors.values():
            if tensor.numel() == 0:  # a rank's empty share: no bytes, and no [0, -1] view to cut
                continue
            flat = tensor.detach().reshape(tensor.shape[0], -1) if tensor.dim() else tensor.detach().reshape(1, 1)
            step = _rows_per_piece(flat)
            for start in range(0, flat.shape[0], step):
                piece = flat[start : start + step].to("cpu").contiguous()
                f.write(piece.view(torch.uint8).numpy().tobytes())
        f.flush()
        os.fsync(f.fileno())


def share_tensors(model, output_optimizer=None) -> dict[str, torch.Tensor]:
    """This rank's rows of the output layer's row-sharded tensors (state-dict names) and, given the output optimizer,
    their optimizer state of one row per weight row (momentum)."""
    layer, prefix = model.output_layer, layer_prefix(model)
    tensors = {prefix + name: value for name, value in layer.state_dict().items() if name in ROW_SHARDED_TENSORS}
    if getattr(layer, "is_share", False):  # its label ids: the head rows', then the tail slots'
        labels = layer.output_labels
        head, tail = labels.split([layer.head_width, labels.numel() - layer.head_width])
        tensors.update({prefix + LABEL_ID_TENSORS[0]: head, prefix + LABEL_ID_TENSORS[1]: tail})
    if output_optimizer is not None:
        for name, param in layer.named_parameters():
            if name in ROW_SHARDED_TENSORS and param in output_optimizer.state:
                for key, value in output_optimizer.state[param].items():
                    if isinstance(value, torch.Tensor) and value.dim() > 0:
                        tensors[optimizer_entry_name(prefix + name, key)] = value
    return tensors


def _index(model, tensors: dict[str, torch.Tensor]) -> dict:
    """The shards' index of a save of `model` whose rank 0 holds `tensors` (every rank holds the same names)."""
    layer = model.output_layer
    slices, head_count, group_count = layer.slices, layer.head_label_count, layer.tail_group_count
    whole = {"head_rows": (0, head_count), "tail_groups": (0, group_count), "group_size": layer.group_size}
    shapes = {name: [row_range(name, **whole)[1], *tensor.shape[1:]] for name, tensor in tensors.items()}
    names = None
    if model.label_names is not None:
        ranges = balanced_ranges(model.config.label_count, len(slices))
        files = [label_names_file(rank, len(slices)) for rank in range(len(slices))]
        names = {
            "label_count": model.config.label_count,
            "files": [{"file": file, "labels": list(labels)} for file, labels in zip(files, ranges)],
        }
    return {
        **({} if names is None else {"label_names": names}),
        "format": OUTPUT_SHARDS_FORMAT,
        "version": 1,
        "group_size": layer.group_size,
        "head_rows": head_count,
        "tail_groups": group_count,
        "tensors": {name: {"shape": shape} for name, shape in shapes.items()},
        "shards": [
            {
                "file": output_shard_file(rank, len(slices)),
                "head_rows": list(share.head_rows),
                "tail_groups": list(share.tail_groups),
            }
            for rank, share in enumerate(slices)
        ],
    }


def _attempt(action) -> str | None:
    """None when `action()` succeeds, else its error as `Type: message`."""
    try:
        action()
    except Exception as error:  # sent to the other ranks, which raise it with rank 0
        return f"{type(error).__name__}: {' '.join(str(error).split())}"
    return None


def _raise(message: str, where: str):
    kind, _, text = message.partition(": ")
    raise (ValueError if kind == "ValueError" else OSError)(f"{where}{text}")


def _holds_exactly(path: str, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bool:
    """Whether the safetensors file `path` holds `tensors` (names, dtypes, shapes and bytes) and `metadata`, and
    nothing else; read piece by piece, as it is written."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="pt") as handle:
            if set(handle.keys()) != set(tensors) or handle.metadata() != metadata:
                return False
            for name, tensor in tensors.items():
                stored = handle.get_slice(name)
                if stored.get_dtype() != _SAFETENSORS_DTYPES.get(tensor.dtype) or stored.get_shape() != [*tensor.shape]:
                    return False
                flat = tensor.detach().reshape(tensor.shape[0], -1) if tensor.dim() else tensor.detach().reshape(1, 1)
                step = _rows_per_piece(flat)
                for start in range(0, flat.shape[0] if tensor.numel() else 0, step):
                    ours = flat[start : start + step].to("cpu").contiguous()
                    theirs = stored[start : start + step].reshape(ours.shape).contiguous()
                    if not torch.equal(ours.view(torch.uint8), theirs.view(torch.uint8)):
                        return False
    except (SafetensorError, OSError, RuntimeError, ValueError):
        return False
    return True


def _link_share(source_folder: str, path: str, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bool:
    """Makes `path` a hard link to the shard file of the same name in `source_folder` (a checkpoint of the run) where
    that file holds exactly what this rank would write: the final save of a run whose last checkpoint is its final
    state then takes no second copy of the output layer on disk (147 GB of bf16 rows at 10^9 labels). Linked first,
    then checked, so that the bytes checked are the ones the new folder keeps; False, with nothing left at `path`,
    where the file differs, is no plain file, or cannot be linked (another file system): the caller writes it."""
    source = os.path.join(source_folder, os.path.basename(path))
    if os.path.islink(source) or not os.path.isfile(source):
        return False
    try:
        os.link(source, path, follow_symlinks=False)
    except (OSError, NotImplementedError):
        return False
    if stat.S_ISREG(os.lstat(path).st_mode) and _holds_exactly(path, tensors, metadata):
        return True
    os.remove(path)
    return False


def save_sharded_folder(
    model, folder: str | os.PathLike, write_rest=None, output_optimizer=None, link_from: str | None = None
) -> None:
    """Collective (every rank of the output layer's group): saves the label-sharded `model` (a
    `HasteForExtremeClassification` whose output layer is a `ShardedOutputLayer`) into `folder` at once, each
    rank writing its shard (with `output_optimizer`, its optimizer state too), rank 0 the rest and
    `write_rest(staging)` (tokenizer, training arguments, card). Raises on every rank when any rank fails.

    `link_from`: a folder (on the same file system, e.g. the run's last checkpoint) whose shard files a rank links
    instead of writing its own where one holds exactly the bytes it would write (`_link_share`); checked, not
    trusted."""
    layer = model.output_layer
    group, rank, world_size = layer.group, layer.rank, layer.world_size
    folder = os.fspath(folder)

    def write_or_link(path: str, tensors: dict, metadata: dict) -> None:
        if link_from is not None and _link_share(os.fspath(link_from), path, tensors, metadata):
            logger.info(f"Rank {rank}: {os.path.basename(path)} in {folder} is a link to the one of {link_from}.")
        else:
            write_safetensors(path, tensors, metadata)

    def write_share(staging: str) -> dict:
        tensors = share_tensors(model, output_optimizer)
        check_finite_weights(tensors)
        metadata = {"format": "pt", "rank": str(rank), "world_size": str(world_size)}
        write_or_link(os.path.join(staging, output_shard_file(rank, world_size)), tensors, metadata)
        if model.label_names is not None:  # this rank's range of label ids, never the whole list
            start, stop = balanced_ranges(model.config.label_count, world_size)[rank]
            arrays, metadata = name_file_tensors(model.label_names, start, stop)
            with warnings.catch_warnings():  # memory-mapped names are read-only, and only read here
                warnings.filterwarnings("ignore", message=".*not writable.*")
                names = {key: torch.from_numpy(value) for key, value in arrays.items()}
            write_or_link(os.path.join(staging, label_names_file(rank, world_size)), names, metadata)
        return tensors

    def errors_of_all(error: str | None) -> list[tuple[int, str]]:
        errors = [None] * world_size
        dist.all_gather_object(errors, error, group=group)
        return [(r, e) for r, e in enumerate(errors) if e is not None]

    if rank != 0:
        staging = broadcast_object(None, group=group)
        if staging is not None:
            errors_of_all(_attempt(lambda: write_share(staging)))
        outcome = broadcast_object(None, group=group)
        if outcome is not None:
            _raise(outcome, f"Saving {folder} failed (on rank 0): ")
        return

    announced = False

    def write(staging: str) -> None:
        nonlocal announced

        def write_main():  # before the shards: transformers' save removes the weight files it did not write
            tensors = share_tensors(model, output_optimizer)
            prefix = layer_prefix(model)
            in_shards = (*ROW_SHARDED_TENSORS, "output_labels")
            rest = {
                name: value
                for name, value in model.state_dict().items()
                if not (name.startswith(prefix) and name[len(prefix) :] in in_shards)
            }
            check_finite_weights(rest)
            model.write_model_files(staging, state_dict=rest, label_names_file=False)
            with open(os.path.join(staging, OUTPUT_SHARDS_INDEX), "w", encoding="utf-8") as f:
                json.dump(_index(model, tensors), f, indent=1)
            if write_rest is not None:
                write_rest(staging)

        error = _attempt(write_main)
        broadcast_object(staging, group=group)
        announced = True
        errors = errors_of_all(error or _attempt(lambda: write_share(staging)))
        if errors:
            _raise(errors[0][1], f"rank {errors[0][0]}: ")

    outcome = None
    try:
        save_folder_atomically(folder, write)
    except Exception as error:
        outcome = f"{type(error).__name__}: {' '.join(str(error).split())}"
        raise
    finally:
        if not announced:  # the others wait for a staging folder
            broadcast_object(None, group=group)
        broadcast_object(outcome, group=group)


# ------------------------------------------------------------------------------------------------ loading


@torch.no_grad()
def load_folder_rows_(model, folder: str | os.PathLike) -> None:
    """Loads `model` from a HASTE folder (sharded output layer or not, one safetensors file or an indexed set), reading
    only the rows of the output layer it holds: one rank's of a `ShardedOutputLayer`, all of a whole layer."""
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

    folder = os.fspath(folder)
    shards = OutputShards.open(folder)
    index_path = os.path.join(folder, SAFE_WEIGHTS_INDEX_NAME)
    if os.path.isfile(index_path):
        with open(index_path, encoding="utf-8") as f:
            files = json.load(f)["weight_map"]
        outside = next((file for file in files.values() if not is_plain_file_name(file)), None)
        if outside is not None:
            raise ValueError(f"{index_path} names {outside!r}, not a safetensors file beside it: save the model again.")
    elif os.path.isfile(os.path.join(folder, SAFE_WEIGHTS_NAME)):
        files = {}
    else:
        raise FileNotFoundError(f"No {SAFE_WEIGHTS_NAME} (or its index) in {folder}: not a HASTE checkpoint folder.")
    layer, prefix = model.output_layer, layer_prefix(model)
    owned = {"head_rows": layer.head_rows, "tail_groups": layer.tail_groups, "group_size": layer.group_size}
    handles = {}
    for name, target in model.state_dict().items():
        if name == prefix + "output_labels":
            _copy_output_labels_(target, layer, prefix, shards, folder, files, handles)
            continue
        row_sharded = name.startswith(prefix) and name[len(prefix) :] in ROW_SHARDED_TENSORS
        if row_sharded and shards is not None:
            _copy_rows_(target, shards, name, row_range(name, **owned)[0], folder)
            continue
        stored = _file_holding(name, folder, files, handles)
        if row_sharded:
            start, stop = row_range(name, **owned)
            value = stored.get_slice(name)[start:stop]
        else:
            value = stored.get_tensor(name)
        _check_shape(value.shape, target, name, folder)
        target.copy_(value)


def _copy_output_labels_(target: torch.Tensor, layer, prefix: str, shards, folder: str, files, handles) -> None:
    """`target` <- the label ids of `layer`'s positions (a share's, or all): from the shards' label-id parts, or from
    the whole `output_labels` of the main weights (folders saved before the shards held them)."""
    share = getattr(layer, "is_share", False)
    rows = {"head_rows": layer.head_rows, "tail_groups": layer.tail_groups} if share else None
    if shards is not None and prefix + LABEL_ID_TENSORS[0] in shards.shapes:
        target.copy_(shards.output_labels(prefix, target.shape, rows))
        return
    name = prefix + "output_labels"
    stored = _file_holding(name, folder, files, handles).get_slice(name)
    if not share:
        value = stored[:]
    else:  # the share's head rows, then its tail slots, of the whole vector
        first, (start, stop) = (
            layer.head_label_count,
            row_range(prefix + "tail.bias", **rows, group_size=layer.group_size),
        )
        value = torch.cat([stored[slice(*layer.head_rows)], stored[first + start : first + stop]])
    _check_shape(value.shape, target, name, folder)
    target.copy_(value)


def _file_holding(name: str, folder: str, files: dict, handles: dict):
    """The open safetensors file of `folder` that holds tensor `name` (`files`: the index's weight map, empty for one
    file; `handles`: the files opened so far, by path, each opened once); a KeyError where none holds it."""
    from safetensors import safe_open
    from transformers.utils import SAFE_WEIGHTS_NAME

    path = os.path.join(folder, files.get(name, SAFE_WEIGHTS_NAME))
    if path not in handles:
        handles[path] = safe_open(path, framework="pt")
    if name not in handles[path].keys():  # noqa: SIM118  (a safetensors handle has no `in`)
        raise KeyError(f"{folder} holds no tensor {name!r}: it is not a checkpoint of this model.")
    return handles[path]


def _check_shape(shape, target: torch.Tensor, name: str, folder: str) -> None:
    if tuple(shape) != tuple(target.shape):
        raise ValueError(f"{folder}: {name} has shape {tuple(shape)} where this rank needs {tuple(target.shape)}.")


def _copy_rows_(target: torch.Tensor, shards: OutputShards, name: str, first: int, folder: str) -> None:
    """`target` <- rows `[first, first + len(target))` of `name` in the shards, piece by piece."""
    if name not in shards.shapes:
        raise ValueError(f"{folder}: its {OUTPUT_SHARDS_INDEX} lists no {name}: it is not a checkpoint of this model.")
    _check_shape((target.shape[0], *shards.shapes[name][1:]), target, name, folder)
    if first + target.shape[0] > shards.shapes[name][0]:
        raise ValueError(
            f"{folder}: {name} has {shards.shapes[name][0]} rows where this rank needs rows up to "
            f"{first + target.shape[0]}."
        )
    step = _rows_per_piece(target)
    for start in range(0, target.shape[0], step):
        stop = min(start + step, target.shape[0])
        target[start:stop].copy_(shards.read_rows(name, first + start, first + stop))


def load_sharded_model(folder: str | os.PathLike, device=None):
    """Collective: the model saved in `folder` (sharded or not), this rank holding only its share of the output layer,
    built empty in the dtypes the folder stores and read from its rows; how `haste-hf predict` and `evaluate` serve
    under torchrun a model that no one process could hold."""
    from ..modeling.configuration_haste import HasteConfig
    from ..modeling.initialization import deferred_output_rows
    from ..modeling.modeling_haste import HasteForExtremeClassification
    from ..modeling.saving import LABEL_NAMES_FILE
    from .sharded_output_layer import shard_output_layer_

    folder = os.fspath(folder)
    # Seeded alike on every rank (`shard` checks it) for what the folder's weights then replace; the caller's
    # generator state is left as it was.
    with torch.random.fork_rng(devices=[]), deferred_output_rows():
        torch.manual_seed(0)
        model = HasteForExtremeClassification(HasteConfig.from_pretrained(folder))
    shards = OutputShards.open(folder)
    if shards is not None:  # the share is built in the stored dtype: never a float32 copy of bf16 rows
        for module_name in ("head", "tail"):
            module = getattr(model.output_layer, module_name)
            if module is not None and f"output_layer.{module_name}.weight" in shards.shapes:
                module.to(shards.dtype(f"output_layer.{module_name}.weight"))
        shards.close()
    # The share is made on `device` and its rows read into it piece by piece: no host process holds it (37 GB a rank
    # at 10^9 labels on 4 GPUs, 147 GB for the host's 4 processes).
    shard_output_layer_(model, initialize=False, rows_device=device)
    load_folder_rows_(model, folder)
    names_file = os.path.join(folder, LABEL_NAMES_FILE)
    if shards is not None and shards.has_label_names():  # memory-mapped, read a name at a time
        model.set_label_names(shards.label_names(model.config.label_count))
    elif os.path.isfile(names_file):  # a folder saved whole, or before the names had files of their own
        with open(names_file, encoding="utf-8") as f:
            model.set_label_names(json.load(f))
    return model.to(device) if device is not None else model


def output_optimizer_state_to_save(model, output_optimizer) -> dict:
    """The output optimizer's state dict without the state that `save_sharded_folder` put in the shards, and the
    record of what it left out (`ROWS_IN_SHARDS_KEY`: state index -> keys)."""
    state = output_optimizer.state_dict()
    params = [param for group in output_optimizer.param_groups for param in group["params"]]
    sharded = {id(param) for name, param in model.output_layer.named_parameters() if name in ROW_SHARDED_TENSORS}
    moved = {}
    for index, param in enumerate(params):
        entry = state["state"].get(index)
        if entry is None or id(param) not in sharded:
            continue
        keys = [key for key, value in entry.items() if isinstance(value, torch.Tensor) and value.dim() > 0]
        state["state"][index] = {key: value for key, value in entry.items() if key not in keys}
        moved[index] = keys
    return {**state, ROWS_IN_SHARDS_KEY: moved}


@torch.no_grad()
def load_output_momentum_(model, output_optimizer, moved: dict, folder: str) -> None:
    """Puts back the output optimizer's state that `output_optimizer_state_to_save` left in the shards (`moved`, read
    from optimizer.pt, loaded without it): this rank's rows, read piece by piece into buffers of the optimizer's
    dtype on the parameters' device, so that no whole copy is made on the host or the device."""
    shards = OutputShards.open(folder)
    if shards is None:
        raise ValueError(f"{folder}: its optimizer state is in output shards, but it holds no {OUTPUT_SHARDS_INDEX}.")
    layer, prefix = model.output_layer, layer_prefix(model)
    names = {id(param): name for name, param in layer.named_parameters()}
    params = [param for group in output_optimizer.param_groups for param in group["params"]]
    owned = {"head_rows": layer.head_rows, "tail_groups": layer.tail_groups, "group_size": layer.group_size}
    for index, keys in moved.items():
        param = params[int(index)]
        for key in keys:
            name = optimizer_entry_name(prefix + names[id(param)], key)
            value = torch.empty_like(param, dtype=output_optimizer._buffer_dtype(param))
            _copy_rows_(value, shards, name, row_range(name, **owned)[0], folder)
            output_optimizer.state[param][key] = value
    shards.close()


__all__ = [
    "ROWS_IN_SHARDS_KEY",
    "layer_prefix",
    "load_folder_rows_",
    "load_sharded_model",
    "load_output_momentum_",
    "output_optimizer_state_to_save",
    "save_sharded_folder",
    "share_tensors",
    "write_safetensors",
]
