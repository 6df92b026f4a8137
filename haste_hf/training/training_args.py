# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Training arguments of HASTE: two optimizers with their own schedules, and rewiring."""

import json
from dataclasses import dataclass, field, fields

import torch
from transformers import TrainingArguments

from ..modeling.defaults import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_EPOCHS,
    DEFAULT_EVAL_BATCH_SIZE,
    DEFAULT_LEARNING_RATE,
    DEFAULT_OUTPUT_LEARNING_RATE,
    DEFAULT_TAIL_LR_SCALE,
)
from ..modeling.rewiring import DEFAULT_REWIRINGS, check_rewiring_options
from .callbacks import NON_FINITE_ACTIONS


OUTPUT_LAYER_DTYPES = ("float32", "bfloat16")


# transformers 5.24 renamed `gradient_checkpointing` `activation_checkpointing` (the old name still works, with a
# deprecation warning); earlier 5.x have only the old one. `HasteTrainingArguments` takes the new name on every version.
HAS_ACTIVATION_CHECKPOINTING = any(
    argument.name == "activation_checkpointing" for argument in fields(TrainingArguments)
)
_CHECKPOINTING_RENAMES = (
    ("gradient_checkpointing", "activation_checkpointing"),
    ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
)


def bf16_is_supported(use_cpu: bool = False) -> bool:
    import torch

    return not use_cpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def fused_update_conflicts(args) -> list[tuple[str, str]]:
    """(field, the value that would allow it) of each setting of `args` that `output_fused_update` cannot serve:
    its update happens in `loss.backward()`, before the Trainer sees the whole gradient."""
    needs_whole_gradient = {
        "gradient_accumulation_steps": (args.gradient_accumulation_steps > 1, "1"),
        "output_max_grad_norm": (args.output_max_grad_norm > 0, "0"),
        "on_non_finite": (args.on_non_finite == "skip", "'stop'"),
        "fp16": (args.fp16, "False (bf16 has no loss scaling)"),
    }
    return [(name, fix) for name, (refused, fix) in needs_whole_gradient.items() if refused]


@dataclass
class HasteTrainingArguments(TrainingArguments):
    """`TrainingArguments` for [`HasteTrainer`].

    The inherited `learning_rate`, `weight_decay`, `lr_scheduler_type`, `warmup_steps` and `max_grad_norm`
    configure the encoder's AdamW (which also trains the head/tail projections); the `output_*` fields
    configure the SGD that trains the dense head and the sparse tail. The two are clipped apart: with a
    BCE summed over labels, the output layer's gradient norm grows with the label count, and clipping it
    together with the encoder's would shrink the encoder's steps and stall the output layer.

    The defaults are the recipe measured in `benchmarks/recipe_study.py` (`benchmarks/README.md`): 10 epochs of
    batch 128, AdamW at 2e-4 with 10% warm-up, cosine and weight decay 0.01, SGD at 0.4 with momentum 0.9 and
    decoupled weight decay 1e-4 (the tail's at `DEFAULT_TAIL_LR_SCALE` times the head's rate, as in `haste-hf train`),
    bf16 (autocast and a bf16 output layer) wherever the GPU has it, and 6 rewirings of 20% of the tail's
    (group, slot) pairs spread over the first two thirds of training.
    """

    learning_rate: float = field(default=DEFAULT_LEARNING_RATE, metadata={"help": "Encoder (AdamW) learning rate."})
    num_train_epochs: float = field(
        default=DEFAULT_EPOCHS, metadata={"help": "Epochs of training (unless `max_steps`)."}
    )
    per_device_train_batch_size: int = field(
        default=DEFAULT_BATCH_SIZE, metadata={"help": "Training batch size per device."}
    )
    per_device_eval_batch_size: int = field(
        default=DEFAULT_EVAL_BATCH_SIZE,
        metadata={"help": "Batch size of evaluation, prediction and the label embeddings, per device."},
    )
    warmup_steps: float = field(
        default=0.1, metadata={"help": "Encoder warm-up: steps if >= 1, else a fraction of training."}
    )
    weight_decay: float = field(default=0.01, metadata={"help": "Encoder AdamW weight decay."})
    bf16: bool | None = field(
        default=None,
        metadata={
            "help": "bf16 autocast and a bf16 head and tail (the paper); "
            "default: on where the GPU supports bf16, off on CPUs."
        },
    )
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "Encoder learning-rate schedule."})
    output_learning_rate: float = field(
        default=DEFAULT_OUTPUT_LEARNING_RATE, metadata={"help": "Output layer (SGD) learning rate."}
    )
    output_tail_lr_scale: float = field(
        default=DEFAULT_TAIL_LR_SCALE,
        metadata={
            "help": "The sparse tail's SGD learning rate as a multiple of the output layer's (the head keeps "
            f"`output_learning_rate`; one schedule scales both; default {DEFAULT_TAIL_LR_SCALE:g}): 1, one rate for "
            "head and tail. A checkpoint resumes only with 1 if it was trained with 1, and only with another value "
            "if not."
        },
    )
    output_momentum: float = field(default=0.9, metadata={"help": "Output layer SGD momentum (0: no buffer)."})
    output_weight_decay: float = field(default=1e-4, metadata={"help": "Output layer decoupled weight decay."})
    output_lr_scheduler_type: str = field(default="cosine", metadata={"help": "Output layer learning-rate schedule."})
    output_lr_scheduler_kwargs: dict | str | None = field(
        default=None, metadata={"help": "Extra arguments of the output layer's schedule (a dict, or its JSON text)."}
    )
    output_warmup_steps: float = field(
        default=0.0, metadata={"help": "Output layer warm-up: steps if >= 1, else a fraction of training."}
    )
    output_max_grad_norm: float = field(
        default=0.0, metadata={"help": "Clip the output layer's gradient norm to this (0: no clipping)."}
    )
    output_stochastic_rounding: bool = field(
        default=True, metadata={"help": "Round bfloat16 output-layer weights stochastically after each update."}
    )
    output_momentum_dtype: str | None = field(
        default=None,
        metadata={
            "help": "Dtype of the output layer's SGD momentum: 'float32', or 'bfloat16' (stochastically rounded "
            "with `output_stochastic_rounding`) to halve its memory. Default: chosen by `HasteTrainer` "
            "(haste_hf.training.memory_plan): bfloat16 where the output layer trains in bf16 on a GPU, else float32."
        },
    )
    output_chunked_backward: bool | None = field(
        default=None,
        metadata={
            "help": "Run the output layer's loss backward in label chunks, recomputing their logits (one more "
            "forward pass of the output layer), so no [batch, labels] logit gradient is stored. Default: chosen by "
            "`HasteTrainer`, on where the output layer trains in bf16 on a GPU.",
            "nargs": "?",
            "const": True,
        },
    )
    output_loss_chunk_labels: int = field(
        default=0,
        metadata={
            "help": "Labels per chunk of the chunked backward; 0: as many as make 2^27 logit-gradient elements "
            "(2^20 labels at batch 128)."
        },
    )
    output_fused_update: bool | None = field(
        default=None,
        metadata={
            "help": "Apply the head's and tail's SGD step to each chunk of their weights in the (chunked) loss "
            "backward, where its gradient is computed, so no weight gradient is stored. Excludes gradient "
            "accumulation, `output_max_grad_norm`, `on_non_finite='skip'` and fp16. Default: chosen by "
            "`HasteTrainer`, on where the output layer trains in bf16 on a GPU and nothing excludes it.",
            "nargs": "?",
            "const": True,
        },
    )
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={
            "help": "Recompute the encoder's activations in the backward (`gradient_checkpointing_kwargs`: "
            "'{\"every_n_layers\": N}' for every N-th block). Default: chosen by `HasteTrainer` (haste_hf.training.memory_plan), "
            "on (for as few blocks as fit) only where the planned peak memory would not fit the GPU.",
            "nargs": "?",
            "const": True,
        },
    )
    output_layer_dtype: str | None = field(
        default=None,
        metadata={
            "help": "Cast head and tail to this dtype before training; default: bfloat16 with `bf16` (the paper), "
            "else kept."
        },
    )
    rewiring_interval: int | None = field(
        default=None,
        metadata={
            "help": "Steps between rewirings; 0 turns rewiring "
            f"off. Default: {DEFAULT_REWIRINGS} rewirings spread over the first `rewiring_end_fraction` of training."
        },
    )
    rewiring_fraction: float = field(
        default=0.2, metadata={"help": "Share of (group, slot) pairs regrown per rewiring."}
    )
    rewiring_end_fraction: float = field(
        default=2 / 3, metadata={"help": "No rewiring after this fraction of training."}
    )
    rewiring_init: str = field(default="zero", metadata={"help": "Weights of regrown slots: 'zero' or 'random'."})
    rewiring_scope: str = field(
        default="global", metadata={"help": "Prune the weakest pairs over all groups ('global') or in each ('group')."}
    )
    rewiring_seed: int | None = field(default=None, metadata={"help": "Seed of rewiring; defaults to `seed`."})
    rewiring_score: str = field(
        default="mean_abs",
        metadata={
            "help": "How a (group, slot) pair is scored for pruning: 'mean_abs', the mean |w| over the group's labels "
            "(the paper), or 'label_normalized', each label's |w| divided by its own mean first, so that a rare "
            "label's small weights count as much as a frequent one's."
        },
    )
    on_non_finite: str = field(
        default="stop",
        metadata={
            "help": "A step with NaN or infinite gradients: 'stop' training with an error, or 'skip' its update."
        },
    )
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata={
            "help": "Continue the run in `output_dir` from this checkpoint folder, or from its last complete "
            "checkpoint with 'last' (`haste-hf train`: the flag alone); `haste_hf.train` reads it."
        },
    )
    shard_output_layer: bool | None = field(
        default=None,
        metadata={
            "help": "Split head and tail by labels over the processes (true) or replicate them (false); default: split when there is more than one."
        },
    )
    eval_top_k: int = field(default=5, metadata={"help": "Labels predicted per example during evaluation."})
    # The collator tokenizes the `text` column itself, so the Trainer must keep it.
    remove_unused_columns: bool = field(default=False, metadata={"help": "Keep dataset columns for the collator."})
    # Rewiring is identical on every rank; re-sending the supports from rank 0 each step is pure cost.
    ddp_broadcast_buffers: bool | None = field(default=False, metadata={"help": "Broadcast buffers every step (DDP)."})
    if not HAS_ACTIVATION_CHECKPOINTING:
        activation_checkpointing: bool | None = field(
            default=None,
            metadata={
                "help": "Recompute the encoder's activations in the backward instead of keeping them (transformers' "
                "`gradient_checkpointing`, under its name from transformers 5.24); default: the memory plan chooses.",
                # As transformers 5.24 declares it: a bare `--activation_checkpointing` means True.
                "nargs": "?",
                "const": True,
            },
        )

    def __post_init__(self):
        if not HAS_ACTIVATION_CHECKPOINTING and self.activation_checkpointing is not None:
            self.gradient_checkpointing = self.activation_checkpointing
        # The Trainer accepts these and fails deep inside (or trains nothing); refused here, by name.
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be >= 1, got {getattr(self, name)}.")
        for name in ("learning_rate", "weight_decay", "dataloader_num_workers"):
            if getattr(self, name) < 0:
                raise ValueError(f"`{name}` must be >= 0, got {getattr(self, name)}.")
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueError(
                f"`max_steps` must be >= 1, or -1 to train `num_train_epochs` epochs; got {self.max_steps}."
            )
        if self.max_steps == -1 and not self.num_train_epochs > 0:
            raise ValueError(f"`num_train_epochs` must be > 0 (or give `max_steps`), got {self.num_train_epochs}.")
        for name in ("eval_steps", "save_steps"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(
                    f"`{name}` must be > 0 (steps, or a fraction of training if < 1), got {getattr(self, name)}."
                )
        if self.bf16 is None:
            self.bf16 = bf16_is_supported(self.use_cpu)
        # Whether the user set encoder checkpointing (`memory_plan` chooses it otherwise). Recent transformers name it
        # `activation_checkpointing` (None: not set, then False), earlier releases only `gradient_checkpointing`, a bool.
        self._checkpointing_given = (
            self.gradient_checkpointing is not None or getattr(self, "activation_checkpointing", None) is not None
        )
        if self.gradient_checkpointing is None and not HAS_ACTIVATION_CHECKPOINTING:
            self.gradient_checkpointing = False
        if HAS_ACTIVATION_CHECKPOINTING:
            # This class's (and the command line's) `gradient_checkpointing` is a field of its own: passed on under the
            # name this transformers reads, so that its deprecation warning, naming a flag the CLI lacks, never shows.
            for old, new in _CHECKPOINTING_RENAMES:
                if getattr(self, new) is None and getattr(self, old) is not None:
                    setattr(self, new, getattr(self, old))
                    setattr(self, old, None)
        if self.bf16 and self.output_layer_dtype is None:
            self.output_layer_dtype = "bfloat16"
        super().__post_init__()
        if self.dataloader_pin_memory and not torch.cuda.is_available():
            self.dataloader_pin_memory = False  # pinning needs CUDA: without it, torch warns on every dataloader
        if isinstance(self.output_lr_scheduler_kwargs, str):  # from the command line, as `lr_scheduler_kwargs`
            self.output_lr_scheduler_kwargs = json.loads(self.output_lr_scheduler_kwargs)
        for name in ("output_learning_rate", "output_weight_decay", "output_warmup_steps", "output_max_grad_norm"):
            if getattr(self, name) < 0:
                raise ValueError(f"`{name}` must be >= 0, got {getattr(self, name)}.")
        if not self.output_tail_lr_scale > 0:
            raise ValueError(
                f"`output_tail_lr_scale` must be > 0 (1: the head's learning rate), got {self.output_tail_lr_scale}."
            )
        if not 0 <= self.output_momentum < 1:
            raise ValueError(f"`output_momentum` must lie in [0, 1), got {self.output_momentum}.")
        if self.output_max_grad_norm > 0 and not self.max_grad_norm > 0:
            raise ValueError(
                "`output_max_grad_norm` takes effect only where the Trainer clips gradients, which needs "
                f"`max_grad_norm` > 0 (got {self.max_grad_norm}); set both, or `output_max_grad_norm=0`."
            )
        if self.output_momentum_dtype not in (None, *OUTPUT_LAYER_DTYPES):
            raise ValueError(
                f"`output_momentum_dtype` must be one of {OUTPUT_LAYER_DTYPES} or None (chosen by the trainer), got "
                f"{self.output_momentum_dtype!r}."
            )
        if self.output_loss_chunk_labels < 0:
            raise ValueError(
                f"`output_loss_chunk_labels` must be >= 0 (0: chosen by the batch size), got {self.output_loss_chunk_labels}."
            )
        if (
            self.output_loss_chunk_labels
            and self.output_chunked_backward is False
            and self.output_fused_update is False
        ):
            raise ValueError(
                f"`output_loss_chunk_labels` ({self.output_loss_chunk_labels}) sizes the chunks of the chunked backward, "
                "which is off: add `output_chunked_backward=True` (--output-chunked-backward), or leave the chunk size out."
            )
        conflicts = fused_update_conflicts(self)
        if self.output_fused_update and conflicts:  # asked for, what excludes it is an error (unasked, it goes off)
            name, fix = conflicts[0]
            raise ValueError(
                f"`output_fused_update` applies the output layer's step inside the backward, before the whole "
                f"gradient exists, which `{name}={getattr(self, name)!r}` needs: set `{name}` to {fix}, or "
                "`output_fused_update=False`."
            )
        if self.output_layer_dtype not in (None, *OUTPUT_LAYER_DTYPES):
            raise ValueError(
                f"`output_layer_dtype` must be one of {OUTPUT_LAYER_DTYPES} or None, got {self.output_layer_dtype!r}."
            )
        if self.rewiring_interval is not None and self.rewiring_interval < 0:
            raise ValueError(f"`rewiring_interval` must be >= 0 (0 turns rewiring off), got {self.rewiring_interval}.")
        check_rewiring_options(
            self.rewiring_fraction,
            self.rewiring_scope,
            self.rewiring_init,
            self.rewiring_end_fraction,
            names={
                "fraction": "rewiring_fraction",
                "scope": "rewiring_scope",
                "init": "rewiring_init",
                "end_fraction": "rewiring_end_fraction",
                "score": "rewiring_score",
            },
            score=self.rewiring_score,
        )
        if self.on_non_finite not in NON_FINITE_ACTIONS:
            raise ValueError(f"`on_non_finite` must be one of {NON_FINITE_ACTIONS}, got {self.on_non_finite!r}.")
        if self.eval_top_k < 1:
            raise ValueError(f"`eval_top_k` must be >= 1, got {self.eval_top_k}.")
