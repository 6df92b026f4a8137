# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""HASTE extreme multi-label classification over any Hugging Face encoder.

encoder -> pooled h -> output layer (`output_layer.HasteOutputLayer`): a dense head over the most frequent
labels and a group-shared fixed fan-in sparse tail over the rest, with the loss, top-k and logits.

This file is flat and imports only torch, transformers and its exportable siblings, so
`register_for_auto_class` can export it next to a checkpoint for `trust_remote_code=True` loading without
`haste_hf` installed.
"""

import functools
import json
import os
import types
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn
from transformers import AutoConfig, AutoModel, PreTrainedModel
from transformers import initialization as init
from transformers.utils import ModelOutput, cached_file

from .checks import _describe, _output_layer_shape, check_encoder_inputs, checked_label_names
from .configuration_haste import HasteConfig
from .device_map import _offload_output_layer_whole
from .encoder import (
    checkpointed_forward,
    encoder_token_limit,
    layer_stack,
    load_pretrained_encoder,
    pool_hidden_states,
    pooler_free_kwargs,
)
from .initialization import OUTPUT_ROWS, cast_beside_output_rows, initialize_output_rows_, linear_init_std
from .label_positions import default_output_labels, label_count_and_head, output_labels_from_frequencies
from .logging_utils import get_logger
from .model_sources import resolve_encoder
from .output_layer import HasteOutputLayer, TopKOutput
from .output_shards import NAMES_IN_SHARDS, OutputShards, loading_with_shards
from .saving import INTERNAL_FILES, LABEL_NAMES_FILE, check_finite_weights, read_one_save, save_folder_atomically
from .sentence_transformer_encoder import (
    from_sentence_transformer,
    is_sentence_transformer,
    sentence_transformer_folder,
    warn_normalize_left_out,
)
from .sparse_ops import GroupSparseLinear, random_supports


logger = get_logger(__name__)

_HUB_KWARGS = ("cache_dir", "revision", "token", "local_files_only")
_PUSH_ARGUMENTS = ("private", "token", "revision", "commit_message", "commit_description", "create_pr", "tags")
# Checkpoint formats 1 and 2 (see `HASTE_FORMAT_VERSION`) kept the output layer's tensors at the model's top
# level: `from_pretrained` renames them (transformers' `key_mapping`, regular expressions).
FORMAT_2_KEY_MAPPING = {
    r"^(head|tail|head_projection|tail_projection)\.": r"output_layer.\1.",
    r"^output_labels": "output_layer.output_labels",
}


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
    # The output layer's loss and top-k read its head and tail weights inside its forward: a device map keeps it whole
    # on one device, where accelerate's hook brings its weights (offloaded or not) for the forward. The encoder's own
    # blocks are added by `post_init`.
    _no_split_modules = ["HasteOutputLayer"]

    @property
    def is_gradient_checkpointing(self) -> bool:
        # The name transformers deprecated in favour of `is_activation_checkpointing`; peft's `get_peft_model` still
        # reads it, and the deprecation warning would be printed on every LoRA model built.
        return any(getattr(module, "gradient_checkpointing", False) for module in self.modules())

    def _set_gradient_checkpointing(
        self, enable: bool = True, gradient_checkpointing_func=None, every_n_layers: int = 1
    ):
        """Activation checkpointing of the encoder, whatever its family: through its own transformers code where
        it has some, else (MPNet, ...) each block of its layer stack recomputes its activations in the backward."""
        encoder = getattr(self, "encoder", None)
        if encoder is None or getattr(encoder, "supports_gradient_checkpointing", False):
            # Only the arguments given: earlier transformers 5.x take no `every_n_layers`.
            kwargs = (
                {}
                if gradient_checkpointing_func is None
                else {"gradient_checkpointing_func": gradient_checkpointing_func}
            )
            if every_n_layers != 1:
                kwargs["every_n_layers"] = every_n_layers
            return super()._set_gradient_checkpointing(enable, **kwargs)
        layers = layer_stack(encoder)
        if layers is None:
            raise ValueError(
                f"The encoder ({type(encoder).__name__}) has no stack of layers to checkpoint; train without "
                "`gradient_checkpointing`."
            )
        for index, layer in enumerate(layers):
            layer.gradient_checkpointing = enable and index % every_n_layers == 0
            if enable:
                layer._gradient_checkpointing_func = gradient_checkpointing_func or functools.partial(
                    torch.utils.checkpoint.checkpoint, use_reentrant=False
                )
                layer.forward = types.MethodType(checkpointed_forward, layer)
            else:
                layer.__dict__.pop("forward", None)

    def _init_weights(self, module):
        layers = [layer for layer in self.modules() if isinstance(layer, HasteOutputLayer)]
        if isinstance(module, (nn.Linear, GroupSparseLinear)) and any(module in (x.head, x.tail) for x in layers):
            return  # with its layer, below: block by block, so that a rank can build its share alone
        super()._init_weights(module)
        if isinstance(module, HasteOutputLayer):
            # One draw from torch's generator (alike on every rank), on the meta device too: the model's later draws
            # do not depend on where its rows are.
            module.initial_weight_seed = int(torch.randint(2**62, (), device="cpu"))
            module.initial_head_std = linear_init_std(self.config)
            initialize_output_rows_(module, module.initial_weight_seed, module.initial_head_std)
            if module.output_labels.device.type != "meta":  # else each rank's share takes its own from the source
                init.copy_(module.output_labels, default_output_labels(module))


class HasteForExtremeClassification(HastePreTrainedModel):
    """An encoder, pooling and HASTE's output layer (`self.output_layer`): a dense head over the most
    frequent labels and a group-sparse tail over the rest.

    Build one around a pretrained encoder with [`~HasteForExtremeClassification.from_encoder_pretrained`],
    load a trained one with `from_pretrained`. `forward` takes labels as padded positive ids `[B, P]`
    (`-100` padding) or as a dense multi-hot `[B, label_count]`; `predict_topk` scores all labels in
    chunks without a `[B, label_count]` tensor.
    """

    def __init__(self, config: HasteConfig, encoder: PreTrainedModel | None = None):
        super().__init__(config)
        # A given encoder keeps its weights: transformers marks them initialised, so `post_init` skips them.
        self.encoder = (
            encoder
            if encoder is not None
            else AutoModel.from_config(config.encoder, **pooler_free_kwargs(config.encoder))
        )
        self.dropout = nn.Dropout(config.classifier_dropout)
        # Initialised by `post_init` (transformers' initialisation, which loading skips), not by the layer.
        self.output_layer = HasteOutputLayer.from_config(config, initialize=False, **(OUTPUT_ROWS.get() or {}))
        self.label_names: list[str] | None = config.label_names  # `label_names.json` replaces them on loading
        self.post_init()
        self._keys_to_ignore_on_load_missing = set(self._keys_to_ignore_on_load_missing or ()) | NAMES_IN_SHARDS.get()

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
                pooling the model keeps unless `pooling` is given; its Normalize is left out with a warning, as
                `haste-hf train` leaves it out (a given `normalize` decides, without it). A model object is used
                as it is (shared, not copied).
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
        label_count, head_label_count = label_count_and_head(
            label_count, head_label_count, head_label_fraction, layout, label_frequencies, label_grouping, config_kwargs
        )
        if encoder_kwargs and not isinstance(encoder, (str, os.PathLike)):
            logger.warning(
                "`encoder_kwargs` is ignored: they are arguments of loading, and the encoder is given as a model."
            )
        if isinstance(encoder, (str, os.PathLike)):
            given, encoder = encoder, resolve_encoder(encoder)
            encoder_kwargs = dict(encoder_kwargs or {})
            hub_kwargs = {name: encoder_kwargs[name] for name in _HUB_KWARGS if name in encoder_kwargs}
            sentence_transformer = sentence_transformer_folder(encoder, config_kwargs.get("pooling"), **hub_kwargs)
            if sentence_transformer is not None:
                subfolder, config_kwargs["pooling"], ends_in_normalize = sentence_transformer
                if ends_in_normalize and "normalize" not in config_kwargs:
                    warn_normalize_left_out(f"The SentenceTransformer in {given}")
                if subfolder:
                    encoder_kwargs.setdefault("subfolder", subfolder)
            encoder_config = AutoConfig.from_pretrained(encoder, **encoder_kwargs)
            encoder = load_pretrained_encoder(encoder, **pooler_free_kwargs(encoder_config), **encoder_kwargs)
        elif is_sentence_transformer(encoder):
            encoder, config_kwargs["pooling"], ends_in_normalize = from_sentence_transformer(
                encoder, config_kwargs.get("pooling")
            )
            if ends_in_normalize and "normalize" not in config_kwargs:
                warn_normalize_left_out("The SentenceTransformer given as `encoder`")
        if not isinstance(encoder, PreTrainedModel):
            raise ValueError(
                f"`encoder` must be a model id, a path, a PreTrainedModel or a SentenceTransformer, got {type(encoder).__name__}."
            )
        if pooler_free_kwargs(encoder.config) and getattr(encoder, "pooler", None) is not None:
            encoder.pooler = None  # as `__init__` builds it: no pooler, so saved weights match a fresh model
        config = HasteConfig(
            encoder=encoder.config, label_count=label_count, head_label_count=head_label_count, **config_kwargs
        )
        model = cast_beside_output_rows(cls(config, encoder=encoder), encoder.dtype)
        if layout is not None:
            model.output_layer.set_output_labels_(layout)
        else:
            if label_frequencies is None:
                label_frequencies = torch.arange(label_count, 0, -1)
            model.output_layer.set_output_labels_(
                output_labels_from_frequencies(config, label_frequencies, label_grouping)
            )
        model.set_label_names(label_names)
        return model

    def set_label_names(self, label_names: list[str] | None):
        """One name per label, or None (`LABEL_{id}`, transformers' naming). An empty name becomes `LABEL_{id}`;
        names that repeat (label texts of real datasets do) are kept, with a warning: the pipeline shows them
        alike, and `config.label2id` maps such a name to the last of its labels."""
        label_names = checked_label_names(label_names, self.config.label_count, logger)
        self.label_names = label_names
        self.config.set_label_names(self.label_names)

    def add_labels(
        self, texts, examples=None, negatives=None, names=None, head: bool | None = None, tokenizer=None, **options
    ) -> list[int]:
        """Adds labels to this trained model from their texts (and optionally a few examples), without retraining;
        returns their ids (`label_count`, `label_count + 1`, ...). The scores of every existing label stay
        bit-identical, and the model saves, loads and serves as any other.

        Args:
            texts: one text describing each new label (as the dataset's label texts do).
            examples: optional positive example texts: a list with one list per new label, or a mapping from a
                new label's name or id to its texts. Needs `negatives`.
            negatives: texts tagged with none of the new labels (a sample of the training texts); given, the new
                labels' weights alone are fitted for a few steps on their positives (their text and examples)
                against these (`fit_steps=0`: not fitted), and the new labels' biases are calibrated on them (else
                on the trained labels' texts; `haste_hf/labels/priors.py`). A tail without bias gains one, zero
                for the existing labels.
            names: the new labels' names (default: their texts where the model has names).
            head: put the new labels in the dense head rather than in tail groups of their own.
            tokenizer: the model's tokenizer (default: the one saved with it).
            **options: `fit_steps`, `learning_rate`, `seed`, `batch_size`, `max_length` (see
                `haste_hf.labels.additions.add_labels`).
        """
        try:
            from haste_hf.labels.additions import add_labels
        except ImportError as error:  # remote code loaded without the package
            raise ImportError("`add_labels` needs the haste_hf package: `pip install haste_hf`.") from error
        return add_labels(self, texts, examples, negatives, names, head, tokenizer, **options)

    # ----------------------------------------------------------------------------------------- encoding

    @property
    def max_input_tokens(self) -> int | None:
        """The most tokens a text may have (the encoder's positions), or None when its config names no limit."""
        return encoder_token_limit(self.encoder)

    def encode(self, input_ids=None, attention_mask=None, **encoder_kwargs):
        """Pooled encoder output `[B, hidden]` and the encoder's outputs."""
        if input_ids is not None and input_ids.shape[0] == 0:
            # Encoders refuse a batch of no rows, which a rank out of texts still passes through a sharded output
            # layer (its collectives need every rank): encode one blank row, keep none.
            blank = input_ids.new_zeros(1, max(1, input_ids.shape[1]))
            pooled, outputs = self.encode(blank, torch.ones_like(blank))
            return pooled[:0], outputs
        check_encoder_inputs(input_ids, encoder_kwargs.get("inputs_embeds"), self.max_input_tokens)
        outputs = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **encoder_kwargs)
        states = outputs[0]
        if attention_mask is None:
            attention_mask = torch.ones(states.shape[:2], dtype=torch.long, device=states.device)
        # Split over devices (`device_map`), the encoder ends where its last block sits, not where its inputs were.
        attention_mask = attention_mask.to(states.device)
        pooled = pool_hidden_states(states, attention_mask, self.config.pooling)
        if self.config.normalize:
            pooled = F.normalize(pooled, dim=-1)
        return self.dropout(pooled), outputs

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
        scored = self.output_layer(pooled, labels=labels, top_k=top_k, return_logits=return_logits)
        output = ExtremeClassifierOutput(
            **scored,
            hidden_states=getattr(encoder_outputs, "hidden_states", None),
            attentions=getattr(encoder_outputs, "attentions", None),
        )
        return output if return_dict is not False else output.to_tuple()

    @torch.no_grad()
    def predict_topk(self, input_ids=None, attention_mask=None, k: int = 5, **encoder_kwargs) -> TopKOutput:
        """The `k` best labels of each example, scoring the tail in chunks of groups so that memory stays
        `O(B * (k + chunk))`, never `O(B * label_count)`."""
        self.output_layer.check_k(k)
        pooled, _ = self.encode(input_ids, attention_mask, **encoder_kwargs)
        # Through the layer's forward, where a device map's hook places its inputs and its (offloaded) weights.
        scored = self.output_layer(pooled, top_k=k, return_logits=False)
        return TopKOutput(label_ids=scored.top_label_ids, scores=scored.top_scores)

    # ----------------------------------------------------------------------------------------- saving

    def _writes_on_this_rank(self, is_main_process: bool) -> bool:
        """Whether this process writes a save: the main process, rank 0 where a process group is up (transformers'
        `should_save_on_this_rank` where it has one; releases before it have none)."""
        if hasattr(PreTrainedModel, "should_save_on_this_rank"):
            return self.should_save_on_this_rank(is_main_process)
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        return is_main_process and not (distributed and torch.distributed.get_rank() != 0)

    def save_pretrained(self, save_directory, *args, push_to_hub: bool = False, **kwargs):
        """`PreTrainedModel.save_pretrained`, plus the label names, written all-or-nothing (see
        [`save_folder_atomically`]); refuses weights that are not finite. With `push_to_hub=True` the
        saved model is then published to `repo_id` (default: the folder's name) by `push_to_hub`."""
        save_directory = os.fspath(save_directory)
        hub_kwargs = {name: kwargs.pop(name) for name in _PUSH_ARGUMENTS if name in kwargs}
        repo_id = kwargs.pop("repo_id", None) or os.path.basename(os.path.abspath(save_directory))
        if self.output_layer.is_share:
            raise ValueError(
                "This model holds one rank's share of the output layer: save it on every rank with "
                "`haste_hf.training.shard_checkpoints.save_sharded_folder` (or `HasteTrainer.save_model`)."
            )
        peft_modules = sorted(
            {type(module).__name__ for module in self.modules() if type(module).__module__.startswith("peft.")}
        )
        if peft_modules:
            # Their weights would be saved under the adapters' names, which `from_pretrained` does not read.
            raise ValueError(
                f"This model holds PEFT modules ({', '.join(peft_modules)}), e.g. LoRA put on `model.encoder`: its "
                "checkpoint would not load back. Merge them first (`model.encoder = model.encoder.merge_and_unload()`), "
                "or wrap the whole model with `peft.get_peft_model(model, config)` and save the adapter."
            )
        if not self._writes_on_this_rank(kwargs.get("is_main_process", True)):
            # Other ranks write nothing; they take part only in what the save gathers from them (transformers'
            # own distributed saving, where it has one: earlier 5.x releases would write from every rank).
            if hasattr(PreTrainedModel, "should_save_on_this_rank"):
                return super().save_pretrained(save_directory, *args, **kwargs)
            return None
        check_finite_weights(self.state_dict() if kwargs.get("state_dict") is None else kwargs["state_dict"])

        save_folder_atomically(save_directory, lambda staging: self.write_model_files(staging, *args, **kwargs))
        if push_to_hub:
            return self.push_to_hub(repo_id, **hub_kwargs)
        return None

    def write_model_files(self, folder, *args, label_names_file: bool = True, **kwargs) -> None:
        """Writes the weights, configuration, code and (unless `label_names_file` is False: a sharded save writes them
        in files of its own) label names into `folder` as they are (the staging folder of an atomic save:
        `save_pretrained`, `haste_hf.training.shard_checkpoints.save_sharded_folder`)."""
        super().save_pretrained(folder, *args, **kwargs)
        if self.label_names is not None and label_names_file:
            with open(os.path.join(folder, LABEL_NAMES_FILE), "w", encoding="utf-8") as f:
                json.dump(list(self.label_names), f, ensure_ascii=False)

    def push_to_hub(self, repo_id: str, **kwargs):
        """Publishes the model with its label names, exportable code and HASTE model card in one commit
        (`haste_hf.hub.push_to_hub`): a plain upload would replace the card. Exported remote code where
        `haste_hf` is not installed pushes the transformers way."""
        try:
            from haste_hf.hub import push_to_hub
        except ImportError:
            return super().push_to_hub(repo_id, **kwargs)
        return push_to_hub(self, repo_id, **kwargs)

    def _upload_modified_files(self, working_dir, repo_id, files_timestamps, *args, **kwargs):
        # transformers' push (exported code without `haste_hf`) uploads every file `save_pretrained` wrote into its
        # temporary folder: the marks of the save are counted unchanged there, so never published.
        files_timestamps = {**files_timestamps, **dict.fromkeys(INTERNAL_FILES, float("inf"))}
        return super()._upload_modified_files(working_dir, repo_id, files_timestamps, *args, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, output_loading_info: bool = False, **kwargs):
        """`PreTrainedModel.from_pretrained`, which also reads the label names and checks the output layer; from a
        local folder, the weights, configuration and names of one save: a save to the folder during the load makes it
        load again, or fail (see `read_one_save`).

        HASTE fields given here go through [`HasteConfig`]'s checks. A `label_count` (or `num_labels`) other than the
        checkpoint's re-heads the model, as `num_labels` re-heads a transformers classifier: with
        `ignore_mismatched_sizes=True` the encoder loads and the output layer is a new one (a warning says so); without
        it, the size-mismatch error. `None` in place of a folder builds the model from `config` and `state_dict`."""
        load = functools.partial(
            cls._from_pretrained_once,
            pretrained_model_name_or_path,
            *args,
            output_loading_info=output_loading_info,
            **kwargs,
        )
        if pretrained_model_name_or_path is None:
            return load()
        return read_one_save(
            os.path.join(os.fspath(pretrained_model_name_or_path), kwargs.get("subfolder") or ""), load
        )

    @classmethod
    def _from_pretrained_once(cls, pretrained_model_name_or_path, *args, output_loading_info: bool, **kwargs):
        from_folder = pretrained_model_name_or_path is not None
        hub_kwargs = {name: kwargs[name] for name in (*_HUB_KWARGS, "subfolder") if name in kwargs}
        # Formats 1 and 2 name the output layer's tensors without the `output_layer.` prefix.
        kwargs["key_mapping"] = {**FORMAT_2_KEY_MAPPING, **(kwargs.get("key_mapping") or {})}
        # A label-sharded run's output layer is in row shards beside the other weights (`output_shards`).
        shards = OutputShards.open(pretrained_model_name_or_path, **hub_kwargs) if from_folder else None
        with loading_with_shards(shards):
            model, loading_info = super().from_pretrained(
                pretrained_model_name_or_path, *args, output_loading_info=True, **kwargs
            )
        # Transformers would write the checkpoint back in the format it was read from: saves write the current one.
        model._weight_conversions = [
            conversion
            for conversion in getattr(model, "_weight_conversions", None) or []
            if getattr(conversion, "_original_source_patterns", [None])[0] not in FORMAT_2_KEY_MAPPING
        ]
        source = pretrained_model_name_or_path if from_folder else "the state dict"
        saved_shape = (
            _output_layer_shape(HasteConfig.from_pretrained(pretrained_model_name_or_path, **hub_kwargs))
            if from_folder
            else None
        )
        reheaded = saved_shape is not None and saved_shape != _output_layer_shape(model.config)
        if reheaded and not kwargs.get("ignore_mismatched_sizes", False):
            # Shapes that differ stopped transformers' loading already; these fit the weights and not their labels.
            raise RuntimeError(
                f"Error(s) in loading state_dict for {cls.__name__}: the output layer of {source} ({_describe(saved_shape)}) "
                f"differs from the configuration's ({_describe(_output_layer_shape(model.config))}). To re-head the "
                "model on another label set, pass `ignore_mismatched_sizes=True` (its output layer is then a new one)."
            )
        if from_folder and not reheaded and kwargs.get("dtype", kwargs.get("torch_dtype", "auto")) == "auto":
            # The output layer in the dtypes it was saved in (a bf16 one under a float32 encoder), not the one dtype
            # transformers loads all in: top-k then runs training's fused kernel, not a float32 fallback.
            from .saving import to_stored_dtypes_

            to_stored_dtypes_(model.output_layer, pretrained_model_name_or_path, shards, kwargs, **hub_kwargs)
        if shards is not None and not reheaded:
            shards.load_into_(model)
        _offload_output_layer_whole(model)
        # Missing buffers are rebuilt as `__init__` builds them; a missing weight would be left random.
        buffers = {name for name, _ in model.named_buffers()}
        missing = sorted(
            name
            for name in loading_info["missing_keys"]
            if name not in buffers and not (reheaded and name.startswith("output_layer."))
        )
        if missing:
            unexpected = sorted(loading_info["unexpected_keys"])
            raise ValueError(
                f"{source} lacks {len(missing)} weights of this model (e.g. {missing[:3]}), which "
                f"would be left random"
                + (f"; it holds others instead (e.g. {unexpected[:3]})" if unexpected else "")
                + ". It was not saved from a model of this configuration; a model with LoRA on `model.encoder` saves such "
                "checkpoints: merge LoRA into the encoder first (`model.encoder = model.encoder.merge_and_unload()`)."
            )
        if reheaded:
            model._replace_output_layer()
            logger.warning(
                f"{source}: re-headed. Its output layer ({_describe(saved_shape)}) was left out and the model has a new "
                f"one ({_describe(_output_layer_shape(model.config))}, random weights, labels in id order, no label "
                "names): train it before use."
            )
            return (model, loading_info) if output_loading_info else model
        model.output_layer.check_invariants(source=source)
        names_file = (
            cached_file(
                pretrained_model_name_or_path,
                LABEL_NAMES_FILE,
                _raise_exceptions_for_missing_entries=False,
                _raise_exceptions_for_connection_errors=False,
                **hub_kwargs,
            )
            if from_folder
            else None
        )
        if shards is not None and shards.has_label_names():  # a sharded save's, in files of one rank each
            model.set_label_names(shards.label_names(model.config.label_count))
        elif names_file is not None:
            with open(names_file, encoding="utf-8") as f:
                model.set_label_names(json.load(f))
        return (model, loading_info) if output_loading_info else model

    @torch.no_grad()
    def _replace_output_layer(self) -> None:
        """A new output layer for `self.config`, initialised as a new model's (`post_init`), on the old one's device
        and in its dtype; the label names go back to `LABEL_{id}`."""
        reference = next(iter(self.output_layer.parameters()))
        layer = HasteOutputLayer.from_config(self.config, initialize=False)
        layer.apply(self._init_weights)
        device = reference.device if reference.device.type != "meta" else "cpu"
        self.output_layer = layer.to(device=device, dtype=reference.dtype)
        self.set_label_names(None)


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
    "encoder_token_limit",
    "output_labels_from_frequencies",
    "pool_hidden_states",
    "random_supports",
    "save_folder_atomically",
]
