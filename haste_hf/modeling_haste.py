# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""HASTE extreme multi-label classification over any Hugging Face encoder.

encoder -> pooled h -> P_head h -> dense head logits                     (the most frequent labels)
                    -> P_tail h -> group-shared fixed fan-in tail logits  (all other labels)

Output positions are the head labels, then the tail slots in group order; `output_labels` maps
positions to label ids. Training works in position space (targets are mapped to positions, logits are
never permuted); logits in label order or top-k label ids are produced only for prediction.

This file is flat and imports only torch, transformers and its siblings, so `register_for_auto_class`
can export it next to a checkpoint for `trust_remote_code=True` loading without `haste_hf` installed.
"""

import inspect
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModel, PreTrainedModel
from transformers import initialization as init
from transformers.utils import ModelOutput, cached_file, logging

from .configuration_haste import DEFAULT_HEAD_LABEL_FRACTION, HasteConfig, head_label_count_for
from .losses import LOSSES, output_layer_loss, targets_of_chunk
from .model_sources import resolve_encoder
from .sentence_transformer_encoder import from_sentence_transformer, is_sentence_transformer, sentence_transformer_folder
from .sparse_ops import group_sparse_linear, group_sparse_topk, merge_topk


logger = logging.get_logger(f"transformers.{__name__}")  # see haste_hf/__init__.py: Logging

LABEL_NAMES_FILE = "label_names.json"
_HUB_KWARGS = ("cache_dir", "revision", "token", "local_files_only")
IGNORE_INDEX = -100

# Bounds the `[B, chunk]` block of logits scored at once by top-k off the fused kernels (head, CPU).
_TOPK_CHUNK_ELEMENTS = 1 << 24

# Check label ids on accelerators too, at the cost of a device synchronization per step (CPU tensors are
# always checked; the collator checks them when given `label_count`).
VALIDATE_LABELS = os.environ.get("HASTE_HF_VALIDATE", "0") == "1"


@dataclass
class ExtremeClassifierOutput(ModelOutput):
    """
    Args:
        loss (`torch.FloatTensor` of shape `()`, *optional*): the loss over all labels (`HasteConfig.loss`,
            `HasteConfig.loss_reduction`).
        logits (`torch.FloatTensor` of shape `(batch_size, label_count)`, *optional*): scores in label-id order,
            returned when no labels are given or when `return_logits=True`.
        top_label_ids (`torch.LongTensor` of shape `(batch_size, top_k)`, *optional*): the `top_k` best label
            ids, best first, when `top_k` is given.
        top_scores (`torch.FloatTensor` of shape `(batch_size, top_k)`, *optional*): their logits.
        hidden_states, attentions: the encoder's, when asked for.
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    top_label_ids: torch.LongTensor | None = None
    top_scores: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class TopKOutput(ModelOutput):
    """
    Args:
        label_ids (`torch.LongTensor` of shape `(batch_size, k)`): the k best label ids, best first.
        scores (`torch.FloatTensor` of shape `(batch_size, k)`): their logits.
    """

    label_ids: torch.LongTensor | None = None
    scores: torch.FloatTensor | None = None


class GroupSparseLinear(nn.Module):
    """The sparse tail: `group_count` groups of `group_size` labels, each group reading `fan_in` of the
    `in_features` inputs through its support (`supports[k]`, distinct int32 indices)."""

    def __init__(self, in_features: int, group_count: int, group_size: int, fan_in: int, bias: bool = False):
        super().__init__()
        self.in_features = in_features
        self.weight = nn.Parameter(torch.empty(group_count, group_size, fan_in))
        self.bias = nn.Parameter(torch.empty(group_count * group_size)) if bias else None
        self.register_buffer("supports", torch.empty(group_count, fan_in, dtype=torch.int32))

    @property
    def out_features(self) -> int:
        return self.weight.shape[0] * self.weight.shape[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return group_sparse_linear(x, self.weight, self.supports, self.bias)

    def extra_repr(self) -> str:
        groups, group_size, fan_in = self.weight.shape
        return f"in_features={self.in_features}, groups={groups}, group_size={group_size}, fan_in={fan_in}, bias={self.bias is not None}"


def random_supports(group_count: int, fan_in: int, in_features: int, seed: int) -> torch.Tensor:
    """`[group_count, fan_in]` int32 supports, each row `fan_in` distinct features drawn uniformly.

    Drawn on the CPU from `seed` in fixed-size blocks of groups, so the result depends on the seed
    alone (not on the device, nor on how many groups exist before a given one) and memory stays
    bounded at millions of groups.
    """
    # Explicitly on the CPU, also under a `with torch.device("cuda"):` block, so every device gets these supports.
    generator = torch.Generator(device="cpu").manual_seed(seed)
    supports = torch.empty(group_count, fan_in, dtype=torch.int32, device="cpu")
    block = max(1, (1 << 22) // in_features)
    for start in range(0, group_count, block):
        stop = min(start + block, group_count)
        keys = torch.rand(stop - start, in_features, generator=generator, device="cpu")
        supports[start:stop] = keys.topk(fan_in, dim=1, sorted=False).indices.sort(dim=1).values.int()
    return supports


def default_output_labels(config: HasteConfig) -> torch.Tensor:
    """Positions in label-id order: label l at position l, padding slots of the last group -1."""
    padded = config.head_label_count + config.tail_group_count * config.group_size
    output_labels = torch.full((padded,), -1, dtype=torch.int64)
    output_labels[: config.label_count] = torch.arange(config.label_count)
    return output_labels


def output_labels_from_frequencies(
    config: HasteConfig, label_frequencies, tail_order=None
) -> torch.Tensor:
    """Output positions for a model: the `head_label_count` most frequent labels (ties by id), then the
    tail labels in `tail_order` (an ordering of exactly the tail labels, e.g. a semantic grouping),
    or by decreasing frequency when `tail_order` is None; padding slots -1."""
    frequencies = torch.as_tensor(label_frequencies)
    if frequencies.shape != (config.label_count,):
        raise ValueError(
            f"`label_frequencies` must have one count per label ({config.label_count}), got shape {tuple(frequencies.shape)}."
        )
    by_frequency = torch.sort(-frequencies.to(torch.float64), stable=True).indices
    head, tail = by_frequency[: config.head_label_count], by_frequency[config.head_label_count :]
    if tail_order is not None:
        grouped_by = getattr(tail_order, "group_size", None)
        if grouped_by is not None and grouped_by != config.group_size:
            raise ValueError(
                f"`label_grouping` groups the tail in groups of {grouped_by} labels, but the model's `group_size` is "
                f"{config.group_size}: its groups would straddle the model's. Pass group_size={grouped_by}, or "
                f"group the tail again with group_size={config.group_size}."
            )
        tail_order = torch.as_tensor(getattr(tail_order, "order", tail_order), dtype=torch.int64)
        if tail_order.shape != tail.shape or not torch.equal(tail_order.sort().values, tail.sort().values):
            raise ValueError(
                "`label_grouping` must order exactly the tail labels (all labels but the "
                f"{config.head_label_count} most frequent), each once; got {tail_order.numel()} ids for "
                f"{tail.numel()} tail labels. Group the tail labels returned by the head/tail split."
            )
        tail = tail_order
    output_labels = default_output_labels(config)
    output_labels[: config.label_count] = torch.cat([head, tail])
    return output_labels


def pool_hidden_states(states: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """`[B, T, d]` token states -> `[B, d]`: the first token (`"cls"`), the masked mean (`"mean"`) or the
    last attended token (`"last_token"`, whichever side the padding is on)."""
    if pooling == "cls":
        return states[:, 0]
    if pooling == "mean":
        mask = attention_mask.unsqueeze(-1).to(states.dtype)
        return (states * mask).sum(1) / mask.sum(1).clamp(min=1)
    positions = torch.arange(states.shape[1], device=states.device)
    last = (attention_mask.bool() * positions).argmax(dim=1)
    return states[torch.arange(states.shape[0], device=states.device), last]


# Saves stage their files in a hidden folder inside the target and mark the target while they move the
# files in: a save killed midway leaves the mark, and loading refuses a folder that mixes two saves.
STAGING_PREFIX = ".haste-staging-"
INCOMPLETE_SAVE_FILE = ".haste-save-incomplete"
_PUSH_ARGUMENTS = ("private", "token", "revision", "commit_message", "commit_description", "create_pr", "tags")


def check_complete_save(folder: str):
    """Raises an `OSError` when `folder` holds the mark of an interrupted save (see `save_folder_atomically`)."""
    if os.path.isfile(os.path.join(folder, INCOMPLETE_SAVE_FILE)):
        raise OSError(
            f"{folder} holds an interrupted save ({INCOMPLETE_SAVE_FILE} is present): its files may mix two "
            "saves. Save the model to it again, or load an earlier checkpoint."
        )


def save_folder_atomically(target: str, write) -> None:
    """Calls `write(staging)` to write files into a fresh hidden folder inside `target`, then moves them
    into `target`, replacing what was there: a failed `write` leaves `target` as it was, a kill while the
    files move in leaves a mark that loading refuses. Only `target` need be writable, not its parent.
    Leftovers of killed saves are removed; when the new files include weights, weight files they do not
    replace are removed too (a single file would shadow new shards, and the other way round)."""
    target = os.fspath(target)
    if os.path.isfile(target):
        raise ValueError(f"`save_directory` ({target}) is a file: give a folder path.")
    os.makedirs(target, exist_ok=True)
    for name in os.listdir(target):
        if name.startswith(STAGING_PREFIX):
            shutil.rmtree(os.path.join(target, name), ignore_errors=True)
    staging = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=target)
    try:
        write(staging)
        new_files = sorted(os.listdir(staging))
        marker = os.path.join(target, INCOMPLETE_SAVE_FILE)
        with open(marker, "w", encoding="utf-8") as f:
            json.dump({"files": new_files}, f)
        if any(map(_is_weight_file, new_files)):
            for stale in os.listdir(target):
                if _is_weight_file(stale) and stale not in new_files:
                    os.remove(os.path.join(target, stale))
        for name in new_files:
            destination = os.path.join(target, name)
            if os.path.isdir(destination) and not os.path.islink(destination):
                shutil.rmtree(destination)
            os.replace(os.path.join(staging, name), destination)
        os.remove(marker)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _is_weight_file(name: str) -> bool:
    return name.startswith("model") and name.endswith((".safetensors", ".safetensors.index.json"))


def check_finite_weights(state_dict) -> None:
    """Raises a `ValueError` naming the floating tensors of `state_dict` that hold NaN or infinity (one
    device sync per device, no overflow on large finite values)."""
    named = [(name, tensor) for name, tensor in state_dict.items() if tensor.is_floating_point() and tensor.numel()]
    by_device = {}
    for name, tensor in named:
        by_device.setdefault(tensor.device, []).append((name, tensor))
    bad = []
    for pairs in by_device.values():
        largest = torch._foreach_norm([tensor.detach() for _, tensor in pairs], ord=float("inf"))
        finite = torch.stack([value.float() for value in largest]).isfinite().tolist()
        bad += [name for (name, _), ok in zip(pairs, finite) if not ok]
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise ValueError(
            f"Refusing to save non-finite (NaN or infinite) weights in {shown}: training diverged. Lower the "
            "learning rates, or train with `on_non_finite='skip'` to skip steps whose gradients are not finite."
        )


class HastePreTrainedModel(PreTrainedModel):
    config_class = HasteConfig
    base_model_prefix = "encoder"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    # Summed BCE over labels is already per-example: a Trainer must not rescale it for accumulation.
    accepts_loss_kwargs = False

    @property
    def is_gradient_checkpointing(self) -> bool:
        # The name transformers deprecated in favour of `is_activation_checkpointing`; peft's `get_peft_model` still
        # reads it, and the deprecation warning would be printed on every LoRA model built.
        return any(getattr(module, "gradient_checkpointing", False) for module in self.modules())

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, GroupSparseLinear):
            groups, _, fan_in = module.weight.shape
            bound = 1.0 / math.sqrt(fan_in)
            init.uniform_(module.weight, -bound, bound)
            if module.bias is not None:
                init.zeros_(module.bias)
            supports = random_supports(groups, fan_in, module.in_features, self.config.supports_seed)
            init.copy_(module.supports, supports)
        elif isinstance(module, HasteForExtremeClassification):
            init.copy_(module.output_labels, default_output_labels(self.config))


def _check_layout(layout, label_count, config_kwargs, label_frequencies, label_grouping, head_label_count, head_label_fraction):
    """`(label_count, head_label_count)` of a label layout, after checking it against the other arguments."""
    given = [name for name, value in (("label_frequencies", label_frequencies), ("label_grouping", label_grouping),
                                      ("head_label_fraction", head_label_fraction)) if value is not None]  # fmt: skip
    if given:
        raise ValueError(f"`layout` already fixes the head and the tail order: leave out {', '.join(given)}.")
    if label_count is not None and label_count != layout.label_count:
        raise ValueError(f"`label_count` ({label_count}) differs from the layout's ({layout.label_count}): the layout was made for other data.")
    head_ids = torch.as_tensor(layout.head_ids)
    if head_label_count is not None and head_label_count != head_ids.numel():
        raise ValueError(f"`head_label_count` ({head_label_count}) differs from the layout's head ({head_ids.numel()} labels): leave it out.")
    group_size = config_kwargs.get("group_size")
    if group_size is not None and group_size != layout.group_size:
        raise ValueError(
            f"`group_size` ({group_size}) differs from the layout's G ({layout.group_size}): its tail order groups "
            f"{layout.group_size} labels at a time. Leave `group_size` out, or make a layout with G = {group_size}."
        )
    every_label = torch.cat([head_ids, torch.as_tensor(layout.tail_order)])
    if not torch.equal(every_label.sort().values, torch.arange(layout.label_count, device=every_label.device)):
        raise ValueError(f"The layout's head and tail must hold every label id in [0, {layout.label_count}) exactly once.")
    return layout.label_count, head_ids.numel()


def _is_integer_multi_hot(labels: torch.Tensor, label_count: int) -> bool:
    """Whether integer `labels` `[B, label_count]` of 0s and 1s (what `MultiLabelBinarizer` gives) is a multi-hot.

    Read as padded ids, such a tensor would list labels 0 and 1 over and over, which no collator produces;
    with 2 labels or fewer both readings are plausible, so the caller must say which one it means."""
    if labels.dtype.is_floating_point or labels.dtype == torch.bool or labels.shape[1] != label_count:
        return False
    if not bool(((labels == 0) | (labels == 1)).all()):
        return False
    if label_count <= 2:
        raise ValueError(
            f"Integer `labels` of shape {tuple(labels.shape)} holding only 0 and 1 read both as a multi-hot and as "
            "padded label ids: pass a multi-hot as bool or float, or pad label ids with -100."
        )
    return True


def _check_labels(invalid: torch.Tensor, message: str) -> None:
    """Raises `ValueError(message)` where `invalid` has a True: at once on the CPU (or with
    `HASTE_HF_VALIDATE=1`), else without a host synchronization (nor graph break) per step, stopping the
    run on the device."""
    if VALIDATE_LABELS or (invalid.device.type == "cpu" and not torch.compiler.is_compiling()):
        if bool(invalid.any()):
            raise ValueError(message)
    else:
        torch._assert_async(~invalid.any(), message)


def _encoder_kwargs(encoder_config) -> dict:
    """Drops the pooler where the architecture has an optional one: HASTE pools itself, and an unused
    pooler breaks DDP with gradient checkpointing."""
    model_class = AutoModel._model_mapping[type(encoder_config)]
    return {"add_pooling_layer": False} if "add_pooling_layer" in inspect.signature(model_class.__init__).parameters else {}


class _HeldLoadReports:
    """A logging filter that holds back transformers' load report (a table of the keys a checkpoint lacked or held
    in excess)."""

    def __init__(self):
        self.records = []

    def filter(self, record) -> bool:
        if "LOAD REPORT" in str(record.msg):
            self.records.append(record)
            return False
        return True


def _load_encoder(name, **kwargs) -> PreTrainedModel:
    """`AutoModel.from_pretrained(name)`, without transformers' load report when all it says is that the checkpoint's
    pooler was not loaded: `_encoder_kwargs` leaves the pooler out on purpose. Any other report is shown."""
    report_logger = logging.get_logger("transformers.modeling_utils")
    held = _HeldLoadReports()
    report_logger.addFilter(held)
    try:
        encoder, info = AutoModel.from_pretrained(name, output_loading_info=True, **kwargs)
    finally:
        report_logger.removeFilter(held)
    only_the_pooler = not info["missing_keys"] and not info["mismatched_keys"] and all(
        key.startswith("pooler.") for key in info["unexpected_keys"]
    )
    if not only_the_pooler:
        for record in held.records:
            report_logger.handle(record)
    return encoder


class HasteForExtremeClassification(HastePreTrainedModel):
    """An encoder with a dense head over the most frequent labels and a group-sparse tail over the rest.

    Build one around a pretrained encoder with [`~HasteForExtremeClassification.from_encoder_pretrained`],
    load a trained one with `from_pretrained`. `forward` takes labels as padded positive ids `[B, P]`
    (`-100` padding) or as a dense multi-hot `[B, label_count]`; `predict_topk` scores all labels in
    chunks without a `[B, label_count]` tensor.
    """

    def __init__(self, config: HasteConfig, encoder: PreTrainedModel | None = None):
        super().__init__(config)
        # A given encoder keeps its weights: transformers marks them initialised, so `post_init` skips them.
        self.encoder = encoder if encoder is not None else AutoModel.from_config(config.encoder, **_encoder_kwargs(config.encoder))
        hidden = config.encoder.hidden_size
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.head_projection = self.head = self.tail_projection = self.tail = None
        if config.head_label_count:
            if config.head_projection_dim:
                self.head_projection = nn.Linear(hidden, config.head_projection_dim)
            self.head = nn.Linear(config.head_input_dim, config.head_label_count)
        if config.tail_label_count:
            if config.tail_projection_dim:
                self.tail_projection = nn.Linear(hidden, config.tail_projection_dim)
            self.tail = GroupSparseLinear(
                config.tail_input_dim, config.tail_group_count, config.group_size, config.fan_in, config.tail_bias
            )
        positions = config.head_label_count + config.tail_group_count * config.group_size
        self.register_buffer("output_labels", torch.empty(positions, dtype=torch.int64))
        self.label_names: list[str] | None = config.label_names  # `label_names.json` replaces them on loading
        self._label_positions_cache = None
        # Set by `haste_hf.distributed.shard_output_layer_`: this rank holds a share of head and tail, and
        # scores through it together with the other ranks.
        self.output_layer_shard = None
        self.post_init()

    # ----------------------------------------------------------------------------------------- building

    @classmethod
    def from_encoder_pretrained(
        cls,
        encoder,
        label_count: int | None = None,
        label_frequencies=None,
        label_grouping=None,
        label_names: list[str] | None = None,
        head_label_count: int | None = None,
        head_label_fraction: float | None = None,
        encoder_kwargs: dict | None = None,
        layout=None,
        **config_kwargs,
    ) -> "HasteForExtremeClassification":
        """A new HASTE model around a pretrained encoder.

        Args:
            encoder: a model id or path (loaded with `AutoModel.from_pretrained`; the demo encoder's names load its
                offline copy where the Hub cannot be reached, see `model_sources`) or an encoder model; or a
                `SentenceTransformer`, its folder or Hub id (Transformer, Pooling, optional Normalize), whose
                pooling and normalisation the model keeps unless `pooling` / `normalize` are given. A model
                object is used as it is (shared, not copied).
            label_count: number of labels L (may be left out with a `layout`).
            label_frequencies: training count of each label `[L]`; the head takes the most frequent.
                Without it, labels are taken to be ordered by decreasing frequency already.
            label_grouping: the tail labels in group order (array of ids, or an object with `.order`);
                by default, decreasing frequency.
            label_names: optional names of the L labels, saved with the model.
            head_label_count / head_label_fraction: size of the dense head (give at most one; default: the
                paper's share, `DEFAULT_HEAD_LABEL_FRACTION` = 3% of the labels; 0 for no head).
            encoder_kwargs: extra arguments of `AutoModel.from_pretrained` (e.g. `dtype`, `revision`).
            layout: a `haste_hf.LabelLayout` (head ids, tail order, G): replaces `label_frequencies`,
                `label_grouping` and the head size, and must agree with `label_count` and `group_size`
                where those are given.
            **config_kwargs: the other [`HasteConfig`] fields (`group_size`, `fan_in`, ...).
        """
        if layout is not None:
            label_count, head_label_count = _check_layout(layout, label_count, config_kwargs, label_frequencies,
                                                          label_grouping, head_label_count, head_label_fraction)  # fmt: skip
            config_kwargs["group_size"] = layout.group_size
        elif label_count is None:
            raise ValueError("Give `label_count` (the number of labels), or a `layout` that holds it.")
        if head_label_count is not None and head_label_fraction is not None:
            raise ValueError("Give `head_label_count` or `head_label_fraction`, not both.")
        if head_label_count is None and head_label_fraction is None:
            head_label_fraction = DEFAULT_HEAD_LABEL_FRACTION
        if head_label_fraction is not None:
            if not 0.0 <= head_label_fraction <= 1.0:
                raise ValueError(f"`head_label_fraction` must lie in [0, 1], got {head_label_fraction}.")
            head_label_count = head_label_count_for(head_label_fraction, label_count)
        if encoder_kwargs and not isinstance(encoder, (str, os.PathLike)):
            logger.warning("`encoder_kwargs` is ignored: they are arguments of loading, and the encoder is given as a model.")
        if isinstance(encoder, (str, os.PathLike)):
            encoder = resolve_encoder(encoder)
            encoder_kwargs = dict(encoder_kwargs or {})
            hub_kwargs = {name: encoder_kwargs[name] for name in _HUB_KWARGS if name in encoder_kwargs}
            sentence_transformer = sentence_transformer_folder(encoder, config_kwargs.get("pooling"), **hub_kwargs)
            if sentence_transformer is not None:
                subfolder, config_kwargs["pooling"], normalize = sentence_transformer
                config_kwargs.setdefault("normalize", normalize)
                if subfolder:
                    encoder_kwargs.setdefault("subfolder", subfolder)
            encoder_config = AutoConfig.from_pretrained(encoder, **encoder_kwargs)
            encoder = _load_encoder(encoder, **_encoder_kwargs(encoder_config), **encoder_kwargs)
        elif is_sentence_transformer(encoder):
            encoder, config_kwargs["pooling"], normalize = from_sentence_transformer(encoder, config_kwargs.get("pooling"))
            config_kwargs.setdefault("normalize", normalize)
        if not isinstance(encoder, PreTrainedModel):
            raise ValueError(
                f"`encoder` must be a model id, a path, a PreTrainedModel or a SentenceTransformer, got {type(encoder).__name__}."
            )
        if _encoder_kwargs(encoder.config) and getattr(encoder, "pooler", None) is not None:
            encoder.pooler = None  # as `__init__` builds it: no pooler, so saved weights match a fresh model
        config = HasteConfig(
            encoder=encoder.config, label_count=label_count, head_label_count=head_label_count, **config_kwargs
        )
        model = cls(config, encoder=encoder).to(encoder.dtype)
        if layout is not None:
            model.output_labels.copy_(torch.as_tensor(layout.output_labels()))
        else:
            if label_frequencies is None:
                label_frequencies = torch.arange(label_count, 0, -1)
            model.output_labels.copy_(output_labels_from_frequencies(config, label_frequencies, label_grouping))
        model.set_label_names(label_names)
        return model

    def set_label_names(self, label_names: list[str] | None):
        if label_names is not None and len(label_names) != self.config.label_count:
            raise ValueError(
                f"`label_names` has {len(label_names)} entries for {self.config.label_count} labels: give one name per label."
            )
        self.label_names = None if label_names is None else [str(name) for name in label_names]
        self.config.set_label_names(self.label_names)

    # ----------------------------------------------------------------------------------------- encoding

    def encode(self, input_ids=None, attention_mask=None, **encoder_kwargs):
        """Pooled encoder output `[B, hidden]` and the encoder's outputs."""
        outputs = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **encoder_kwargs)
        states = outputs[0]
        if attention_mask is None:
            attention_mask = torch.ones(states.shape[:2], dtype=torch.long, device=states.device)
        pooled = pool_hidden_states(states, attention_mask, self.config.pooling)
        if self.config.normalize:
            pooled = F.normalize(pooled, dim=-1)
        return self.dropout(pooled), outputs

    def _branch_inputs(self, pooled):
        """Inputs of the head and the tail, each projected if configured and cast to its branch's dtype
        (the output layer may train in bf16 under an fp32 encoder)."""
        head_x = tail_x = None
        if self.head is not None:
            head_x = self.head_projection(pooled) if self.head_projection is not None else pooled
            head_x = head_x.to(self.head.weight.dtype)
        if self.tail is not None:
            tail_x = self.tail_projection(pooled) if self.tail_projection is not None else pooled
            tail_x = tail_x.to(self.tail.weight.dtype)
        return head_x, tail_x

    def position_logits(self, pooled: torch.Tensor) -> torch.Tensor:
        """Logits over output positions `[B, head_label_count + K * G]` (padding slots included)."""
        return self._position_logits(*self._branch_inputs(pooled))

    def _position_logits(self, head_x, tail_x) -> torch.Tensor:
        parts = []
        if self.head is not None:
            parts.append(self.head(head_x))
        if self.tail is not None:
            parts.append(self.tail(tail_x))
        return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]

    # ----------------------------------------------------------------------------------------- labels

    @property
    def label_positions(self) -> torch.Tensor:
        """Inverse of `output_labels`: the output position of each label id `[L]` (derived, cached)."""
        key = (self.output_labels.data_ptr(), self.output_labels._version, self.output_labels.device)
        if self._label_positions_cache is None or self._label_positions_cache[0] != key:
            valid = self.output_labels >= 0
            positions = torch.full((self.config.label_count,), -1, dtype=torch.int64, device=self.output_labels.device)
            positions[self.output_labels[valid]] = torch.nonzero(valid).squeeze(1)
            self._label_positions_cache = (key, positions)
        return self._label_positions_cache[1]

    def _positive_positions(self, labels: torch.Tensor) -> torch.Tensor:
        """Padded positive label ids `[B, P]` -> their output positions, -1 for padding (repeats kept: every
        loss path counts a position once)."""
        label_count = self.config.label_count
        valid = labels != IGNORE_INDEX
        invalid = (valid & (labels < 0)) | (labels >= label_count)
        message = (
            f"`labels` holds ids outside [0, {label_count}) other than the padding value {IGNORE_INDEX}: "
            "pass positive label ids padded with -100, or a dense [batch, label_count] multi-hot."
        )
        if not labels.dtype.is_signed:
            raise ValueError(
                f"`labels` of dtype {labels.dtype} cannot hold the -100 padding of label ids: pass padded ids "
                "as int64, or a multi-hot as float or bool."
            )
        _check_labels(invalid, message)
        return torch.where(valid, self.label_positions[labels.masked_fill(~valid | invalid, 0).long()], -1)

    def _dense_labels(self, labels: torch.Tensor, batch_size: int) -> torch.Tensor | None:
        """`labels` as a dense multi-hot (float, bool, or an integer one of 0s and 1s read as bool), or None
        for padded ids; raises on a malformed `labels`."""
        if labels.dim() != 2 or labels.shape[0] != batch_size:
            raise ValueError(f"`labels` must be 2-D with one row per example, got shape {tuple(labels.shape)}.")
        if _is_integer_multi_hot(labels, self.config.label_count):
            return labels.bool()
        if not (labels.dtype.is_floating_point or labels.dtype == torch.bool):
            return None
        if labels.shape[1] != self.config.label_count:
            raise ValueError(
                f"A dense multi-hot `labels` needs {self.config.label_count} columns, got {labels.shape[1]}: "
                "pass one column per label, or padded positive ids (int64, -100 padding)."
            )
        if labels.dtype != torch.bool:
            _check_labels(~((labels >= 0) & (labels <= 1)), "A dense float `labels` must hold targets in [0, 1] (NaN is not one).")
        return labels

    def _loss_scale(self, batch_size: int) -> float:
        return 1.0 / (batch_size * (self.config.label_count if self.config.loss_reduction == "mean" else 1))

    def compute_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss (`config.loss`) over all labels from materialised position logits, with labels as padded
        ids or a dense multi-hot: the unfused reference, and the path of dense multi-hot labels. Training on
        label ids goes through `fused_loss`, which never materialises the logits."""
        config = self.config
        valid_logits = logits[:, : config.label_count].float()  # padding slots trail the last group
        dense = self._dense_labels(labels, logits.shape[0])
        if dense is not None:
            targets = dense[:, self.output_labels[: config.label_count]].to(valid_logits.dtype)
        else:
            if not labels.dtype.is_signed:
                raise ValueError(
                    f"`labels` of dtype {labels.dtype} cannot hold the -100 padding of label ids: pass padded ids "
                    "as int64, or a multi-hot as float or bool."
                )
            positions = self._positive_positions(labels)
            targets = targets_of_chunk(positions, 0, config.label_count, config.label_count, valid_logits.dtype)
        terms, _ = LOSSES[config.loss](valid_logits, targets)
        return terms.sum() * self._loss_scale(logits.shape[0])

    def fused_loss(self, head_x: torch.Tensor | None, tail_x: torch.Tensor | None, labels: torch.Tensor) -> torch.Tensor:
        """The loss (`config.loss`, `config.loss_reduction`) from the branch inputs and padded label ids,
        each branch's logits consumed where they are computed (`losses.output_layer_loss`): no `[B, L]`
        logits in fp32, no concatenation of head and tail."""
        config = self.config
        batch_size = labels.shape[0]
        positions = self._positive_positions(labels)
        scale = self._loss_scale(batch_size)
        losses = []
        if self.head is not None:
            losses.append(
                output_layer_loss(
                    head_x, self.head.weight, self.head.bias, positions, config.head_label_count, scale, config.loss
                )
            )
        if self.tail is not None:
            tail_positions = positions - config.head_label_count  # head positions and padding fall below 0
            losses.append(
                output_layer_loss(
                    tail_x, self.tail.weight, self.tail.bias, tail_positions, config.tail_label_count, scale,
                    config.loss, supports=self.tail.supports,
                )
            )  # fmt: skip
        return losses[0] if len(losses) == 1 else losses[0] + losses[1]

    def _top_positions(self, position_logits: torch.Tensor, k: int, first_position: int = 0):
        """The `k` best (scores, positions) among `position_logits`, whose first column is output position
        `first_position`; padding slots never win."""
        positions = torch.arange(first_position, first_position + position_logits.shape[1], device=position_logits.device)
        scores = position_logits.float().masked_fill(self.output_labels[positions] < 0, float("-inf"))
        scores, top = scores.topk(min(k, scores.shape[1]), dim=1)
        return scores, top + first_position

    def logits_in_label_order(self, position_logits: torch.Tensor) -> torch.Tensor:
        """Position logits `[B, positions]` -> `[B, label_count]` in label-id order (for small L)."""
        return position_logits[:, self.label_positions]

    # ----------------------------------------------------------------------------------------- forward

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        return_logits: bool | None = None,
        top_k: int | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
    ) -> ExtremeClassifierOutput | tuple:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, max_positives)` or `(batch_size, label_count)`, *optional*):
            Positive label ids padded with -100 (any label count), or a dense multi-hot (float, bool, or
            integer 0/1 as `MultiLabelBinarizer` gives).
        return_logits (`bool`, *optional*):
            Return logits in label order; defaults to True only when no `labels` are given.
        top_k (`int`, *optional*):
            Also return the `top_k` best label ids and their logits (what evaluation needs, at any L). Defaults
            to `config.eval_top_k` (at most the label count) when `labels` are given in eval mode, so that a
            stock `Trainer` evaluating the model gathers top-k ids, not `[N, L]` logits.
        """
        encoder_kwargs = {
            name: value
            for name, value in (
                ("token_type_ids", token_type_ids),
                ("position_ids", position_ids),
                ("inputs_embeds", inputs_embeds),
                ("output_hidden_states", output_hidden_states),
                ("output_attentions", output_attentions),
            )
            if value is not None
        }
        pooled, encoder_outputs = self.encode(input_ids, attention_mask, **encoder_kwargs)
        if top_k is None and labels is not None and not self.training:
            top_k = min(self.config.eval_top_k, self.config.label_count)
        if self.output_layer_shard is not None:
            if return_logits:
                raise ValueError(
                    "A sharded output layer gives no [batch, label_count] logits: pass `top_k` for the best labels."
                )
            return_logits = False
            loss, top_scores, top_label_ids = self.output_layer_shard.forward(self, pooled, labels, top_k)
        else:
            head_x, tail_x = self._branch_inputs(pooled)
            if return_logits is None:
                return_logits = labels is None
            if top_k is not None:
                self._check_k(top_k)
            dense_labels = labels is not None and self._dense_labels(labels, pooled.shape[0]) is not None
            # Logits over all positions only when they are returned, or for a dense multi-hot's loss.
            position_logits = self._position_logits(head_x, tail_x) if return_logits or dense_labels else None
            loss = None
            if labels is not None:
                loss = self.compute_loss(position_logits, labels) if dense_labels else self.fused_loss(head_x, tail_x, labels)
            top_scores = top_label_ids = None
            if top_k is not None:
                if position_logits is not None:
                    top_scores, top_positions = self._top_positions(position_logits, top_k)
                else:
                    top_scores, top_positions = self._branch_topk(head_x, tail_x, top_k)
                top_label_ids = self.output_labels[top_positions]
        output = ExtremeClassifierOutput(
            loss=loss,
            logits=self.logits_in_label_order(position_logits) if return_logits else None,
            top_label_ids=top_label_ids,
            top_scores=top_scores,
            hidden_states=getattr(encoder_outputs, "hidden_states", None),
            attentions=getattr(encoder_outputs, "attentions", None),
        )
        return output if return_dict is not False else output.to_tuple()

    def _check_k(self, k: int):
        if not 1 <= k <= self.config.label_count:
            raise ValueError(f"`k` must lie in [1, label_count={self.config.label_count}], got {k}.")

    @torch.no_grad()
    def predict_topk(self, input_ids=None, attention_mask=None, k: int = 5, **encoder_kwargs) -> TopKOutput:
        """The `k` best labels of each example, scoring the tail in chunks of groups so that memory stays
        `O(B * (k + chunk))`, never `O(B * label_count)`."""
        self._check_k(k)
        pooled, _ = self.encode(input_ids, attention_mask, **encoder_kwargs)
        if self.output_layer_shard is not None:
            return self.output_layer_shard.predict_topk(self, pooled, k)
        scores, positions = self._branch_topk(*self._branch_inputs(pooled), k)
        return TopKOutput(label_ids=self.output_labels[positions], scores=scores)

    def _branch_topk(self, head_x, tail_x, k: int):
        """The `k` best (fp32 scores, output positions) of each example, from the branch inputs: the head in
        chunks of rows, the tail in the forward kernel (`sparse_ops.group_sparse_topk`)."""
        reference = head_x if head_x is not None else tail_x
        batch_size = reference.shape[0]
        best = (reference.new_empty(batch_size, 0, dtype=torch.float32), reference.new_empty(batch_size, 0, dtype=torch.int64))
        if self.head is not None:
            step = max(1, _TOPK_CHUNK_ELEMENTS // max(1, batch_size))
            for start in range(0, self.config.head_label_count, step):
                rows = slice(start, min(start + step, self.config.head_label_count))
                bias = None if self.head.bias is None else self.head.bias[rows]
                best = merge_topk(best, self._top_positions(F.linear(head_x, self.head.weight[rows], bias), k, start), k)
        if self.tail is not None:
            scores, columns = group_sparse_topk(
                tail_x, self.tail.weight, self.tail.supports, self.tail.bias, k, self.config.tail_label_count,
                chunk_elements=_TOPK_CHUNK_ELEMENTS,
            )  # fmt: skip
            best = merge_topk(best, (scores, columns.clamp(min=0) + self.config.head_label_count), k)
        return best

    # ----------------------------------------------------------------------------------------- saving

    def save_pretrained(self, save_directory, *args, push_to_hub: bool = False, **kwargs):
        """`PreTrainedModel.save_pretrained`, plus the label names, written all-or-nothing (see
        [`save_folder_atomically`]); refuses weights that are not finite. With `push_to_hub=True` the
        saved model is then published to `repo_id` (default: the folder's name) by `push_to_hub`."""
        save_directory = os.fspath(save_directory)
        hub_kwargs = {name: kwargs.pop(name) for name in _PUSH_ARGUMENTS if name in kwargs}
        repo_id = kwargs.pop("repo_id", None) or os.path.basename(os.path.abspath(save_directory))
        if self.output_layer_shard is not None and kwargs.get("state_dict") is None:
            raise ValueError(
                "This model holds one rank's share of the output layer: save it on every rank with "
                "`haste_hf.distributed.save_sharded_pretrained` (or `HasteTrainer.save_model`), which gathers it."
            )
        peft_modules = sorted({type(module).__name__ for module in self.modules() if type(module).__module__.startswith("peft.")})
        if peft_modules:
            # Their weights would be saved under the adapters' names, which `from_pretrained` does not read.
            raise ValueError(
                f"This model holds PEFT modules ({', '.join(peft_modules)}), e.g. LoRA put on `model.encoder`: its "
                "checkpoint would not load back. Merge them first (`model.encoder = model.encoder.merge_and_unload()`), "
                "or wrap the whole model with `peft.get_peft_model(model, config)` and save the adapter."
            )
        if not self.should_save_on_this_rank(kwargs.get("is_main_process", True)):
            # Other ranks write nothing; they take part only in what the save gathers from them.
            return super().save_pretrained(save_directory, *args, **kwargs)
        check_finite_weights(self.state_dict() if kwargs.get("state_dict") is None else kwargs["state_dict"])

        def write(staging):
            super(HasteForExtremeClassification, self).save_pretrained(staging, *args, **kwargs)
            if self.label_names is not None:
                with open(os.path.join(staging, LABEL_NAMES_FILE), "w", encoding="utf-8") as f:
                    json.dump(self.label_names, f, ensure_ascii=False)

        save_folder_atomically(save_directory, write)
        if push_to_hub:
            return self.push_to_hub(repo_id, **hub_kwargs)
        return None

    def push_to_hub(self, repo_id: str, **kwargs):
        """Publishes the model with its label names, exportable code and HASTE model card in one commit
        (`haste_hf.hub.push_to_hub`): a plain upload would replace the card. Exported remote code where
        `haste_hf` is not installed pushes the transformers way."""
        try:
            from haste_hf.hub import push_to_hub
        except ImportError:
            return super().push_to_hub(repo_id, **kwargs)
        return push_to_hub(self, repo_id, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, output_loading_info: bool = False, **kwargs):
        folder = os.path.join(os.fspath(pretrained_model_name_or_path), kwargs.get("subfolder") or "")
        check_complete_save(folder)
        model, loading_info = super().from_pretrained(pretrained_model_name_or_path, *args, output_loading_info=True, **kwargs)
        # Missing buffers are rebuilt as `__init__` builds them; a missing weight would be left random.
        buffers = {name for name, _ in model.named_buffers()}
        missing = sorted(name for name in loading_info["missing_keys"] if name not in buffers)
        if missing:
            unexpected = sorted(loading_info["unexpected_keys"])
            raise ValueError(
                f"{pretrained_model_name_or_path} lacks {len(missing)} weights of this model (e.g. {missing[:3]}), which "
                f"would be left random" + (f"; it holds others instead (e.g. {unexpected[:3]})" if unexpected else "") +
                ". It was not saved from a model of this configuration; a model with LoRA on `model.encoder` saves such "
                "checkpoints: merge LoRA into the encoder first (`model.encoder = model.encoder.merge_and_unload()`)."
            )
        model.check_label_layout(source=pretrained_model_name_or_path)
        hub_kwargs = {name: kwargs[name] for name in (*_HUB_KWARGS, "subfolder") if name in kwargs}
        names_file = cached_file(
            pretrained_model_name_or_path,
            LABEL_NAMES_FILE,
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
            **hub_kwargs,
        )
        if names_file is not None:
            with open(names_file, encoding="utf-8") as f:
                model.set_label_names(json.load(f))
        return (model, loading_info) if output_loading_info else model

    def check_label_layout(self, source="the model"):
        """Raises a `ValueError` naming `source` unless the tail's supports are distinct features in
        range and `output_labels` places every label exactly once: a corrupt checkpoint would otherwise
        load and fail in an index error, or rank the wrong labels."""
        if self.tail is not None:
            supports = self.tail.supports
            if supports.numel() and (int(supports.min()) < 0 or int(supports.max()) >= self.tail.in_features):
                raise ValueError(
                    f"{source}: tail supports hold feature indices in [{int(supports.min())}, {int(supports.max())}], "
                    f"outside [0, {self.tail.in_features}): the weights file is corrupt or belongs to another model."
                )
            ordered = supports.sort(dim=1).values
            repeated = (ordered[:, 1:] == ordered[:, :-1]).any(dim=1)
            if bool(repeated.any()):
                group = int(torch.nonzero(repeated)[0])
                raise ValueError(
                    f"{source}: tail group {group} lists a feature twice in its support {supports[group].tolist()}: "
                    "the weights file is corrupt."
                )
        label_count = self.config.label_count
        placed = self.output_labels[self.output_labels >= 0]
        if (
            int((self.output_labels < -1).sum()) or placed.numel() != label_count
            or (placed.numel() and int(placed.max()) >= label_count)
            or placed.unique().numel() != label_count
        ):  # fmt: skip
            raise ValueError(
                f"{source}: `output_labels` must place each of the {label_count} labels exactly once (padding -1): "
                "the weights file is corrupt or belongs to another model."
            )


def __getattr__(name: str):
    # `config.json`'s `custom_pipelines` names the pipeline class in this module (the one file remote code starts
    # from); it is imported when asked for, so that loading a model does not load `transformers.pipelines`.
    if name == "HasteTextClassificationPipeline":
        from .pipeline_haste import HasteTextClassificationPipeline

        return HasteTextClassificationPipeline
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ExtremeClassifierOutput",
    "GroupSparseLinear",
    "HasteForExtremeClassification",
    "HastePreTrainedModel",
    "TopKOutput",
    "default_output_labels",
    "output_labels_from_frequencies",
    "pool_hidden_states",
    "random_supports",
    "save_folder_atomically",
]
