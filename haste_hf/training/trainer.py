# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""`HasteTrainer`: the Hugging Face `Trainer` training HASTE as the paper does.

AdamW trains the encoder and the branch projections, SGD with momentum (stochastic rounding for bf16
weights) trains the dense head and the sparse tail, each with its own schedule; the tail is rewired
every `rewiring_interval` steps; evaluation ranks labels with top-k, never gathering `[N, L]` logits.
"""

import copy
import functools
import inspect
import os
import shutil

import torch
from torch import nn
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase, Trainer
from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME, TRAINER_STATE_NAME, TRAINING_ARGS_NAME
from transformers.trainer_callback import TrainerState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.training_args import OptimizerNames
from transformers.utils import logging as transformers_logging

from ..data import LabelIdPadding, XMCDataCollator
from ..modeling.logging_utils import get_logger
from ..modeling.losses import chunk_loss_backward_
from ..modeling.modeling_haste import HasteForExtremeClassification
from ..modeling.output_shards import OUTPUT_SHARDS_INDEX, OutputShards
from ..modeling.saving import checkpoint_problem, exported_code_files, last_complete_checkpoint
from . import memory_plan
from .callbacks import NonFiniteGradientCallback, RewiringCallback, TrainingSplitFingerprint, unwrap_model
from .checkpoints import _reading, check_label_names, checkpoint_model_differences
from .optimization import (
    HasteOptimizer,
    StochasticRoundingSGD,
    get_haste_scheduler,
    output_parameter_groups,
    split_parameters,
    unwrap_haste_optimizer,
)
from .peft_utils import check_no_peft_encoder, check_peft_model, is_peft_model
from .scaling import multi_gpu_advice
from .shard_checkpoints import (
    ROWS_IN_SHARDS_KEY,
    load_folder_rows_,
    load_output_momentum_,
    output_optimizer_state_to_save,
    save_sharded_folder,
)
from .sharded_output_layer import (
    ignore_shards_in_ddp,
    resolve_shard_output_layer,
    shard_output_layer_,
    sharded_output_layer,
)
from .training_args import HasteTrainingArguments


logger = get_logger(__name__)


# torch 2.13 renamed DDP's `broadcast_buffers` `forward_sync_buffers` and warns on the old name, which accelerate passes
# (`ddp_broadcast_buffers`). The new one also syncs the buffers once, when DDP wraps the model: harmless here, where
# every buffer a rank holds differently (a sharded output layer's) is kept out of DDP (`ignore_shards_in_ddp`) and the
# others are equal on every rank.
DDP_TAKES_FORWARD_SYNC_BUFFERS = (
    "forward_sync_buffers" in inspect.signature(nn.parallel.DistributedDataParallel.__init__).parameters
)


class _ForwardSyncBuffersKwargs:
    """accelerate's DDP kwargs handler, passing `broadcast_buffers` under its current name `forward_sync_buffers`."""

    def __init__(self, handler):
        self.handler = handler

    def to_kwargs(self) -> dict:
        kwargs = self.handler.to_kwargs()
        if "broadcast_buffers" in kwargs:
            kwargs["forward_sync_buffers"] = kwargs.pop("broadcast_buffers")
        return kwargs

    def __getattr__(self, name):  # `register_comm_hook`, ... of the wrapped handler
        return getattr(self.handler, name)


def _as_haste_arguments(args) -> HasteTrainingArguments:
    """`HasteTrainingArguments` with the fields of a stock `TrainingArguments` and HASTE's defaults for the rest."""
    import dataclasses

    from transformers import TrainingArguments

    if not isinstance(args, TrainingArguments):
        raise ValueError(f"`args` must be TrainingArguments or HasteTrainingArguments, got {type(args).__name__}.")
    values = {field.name: getattr(args, field.name) for field in dataclasses.fields(TrainingArguments) if field.init}
    haste_fields = [
        field.name for field in dataclasses.fields(HasteTrainingArguments) if field.init and field.name not in values
    ]
    logger.warning(
        f"`args` is a {type(args).__name__}: HasteTrainer takes its fields and HASTE's defaults for the output layer's "
        f"own ({', '.join(haste_fields)}); pass HasteTrainingArguments to set them."
    )
    return HasteTrainingArguments(**values)


def _warn_ignored_options(args: HasteTrainingArguments) -> None:
    """Warns about the `TrainingArguments` fields that `HasteTrainer` does not use."""
    default = HasteTrainingArguments.__dataclass_fields__["optim"].default
    if OptimizerNames(args.optim) != OptimizerNames(default):
        logger.warning(
            f"`optim={args.optim.value}` is ignored: HasteTrainer trains the encoder with AdamW (`learning_rate`, "
            "`adam_*`, `weight_decay`) and the head and tail with SGD (the `output_*` fields)."
        )
    if args.optim_args:
        logger.warning("`optim_args` is ignored: HasteTrainer builds its own optimizers (see `optim`).")
    if args.label_smoothing_factor:
        logger.warning("`label_smoothing_factor` is ignored: the model computes its own BCE loss.")


class HasteTrainer(Trainer):
    """A `Trainer` for [`HasteForExtremeClassification`] with [`HasteTrainingArguments`].

    Adds a [`RewiringCallback`] when `args.rewiring_interval > 0` and the model has a sparse tail.
    Pass a `compute_metrics` such as `haste_hf.metrics.make_compute_metrics()`: it receives the
    `eval_top_k` best label ids of each example and the padded label ids. Without a `data_collator`, a
    [`XMCDataCollator`] over `processing_class` (the tokenizer) batches raw or pre-tokenized examples.
    `model` may also be a `peft.PeftModel` of a HASTE model (see `haste_hf.training.peft_utils`).
    """

    def __init__(self, model=None, args: HasteTrainingArguments | None = None, *trainer_args, **kwargs):
        if args is None:
            args = HasteTrainingArguments(output_dir="haste_output")
        if not isinstance(args, HasteTrainingArguments):
            args = _as_haste_arguments(args)
        # The trainer's own copy: it takes the memory plan's choices, the caller's keeps what the caller gave.
        args = copy.copy(args)
        haste_model = unwrap_model(model)
        if not isinstance(haste_model, HasteForExtremeClassification):
            raise ValueError(
                f"`model` must be a HasteForExtremeClassification (or a PeftModel of one), got {type(model).__name__}."
            )
        if is_peft_model(model):
            check_peft_model(model, haste_model)
        else:
            check_no_peft_encoder(haste_model)
        if args.output_layer_dtype is not None:
            dtype = getattr(torch, args.output_layer_dtype)
            for module in (haste_model.output_layer.head, haste_model.output_layer.tail):
                if module is not None:
                    module.to(dtype)
        sharded = resolve_shard_output_layer(args.shard_output_layer, args.world_size)
        if sharded:
            shard_output_layer_(haste_model)
            ignore_shards_in_ddp(haste_model)
        advice = multi_gpu_advice(
            haste_model.config.label_count, args.per_device_train_batch_size, args.world_size, sharded
        )
        if advice and args.process_index == 0:
            logger.warning(advice)
        if args.world_size > 1 and args.data_seed is None:
            args.data_seed = args.seed  # see below: the data order must not follow the per-rank seeds
        if not trainer_args and kwargs.get("data_collator") is None:
            # Trainer's default pads token columns only: the ragged label-id lists need this collator.
            tokenizer = kwargs.get("processing_class")
            if not isinstance(tokenizer, PreTrainedTokenizerBase):
                raise ValueError(
                    "HasteTrainer needs a `data_collator` (e.g. haste_hf.data.XMCDataCollator(tokenizer)) or "
                    f"`processing_class=tokenizer` to build one, got processing_class={type(tokenizer).__name__}."
                )
            kwargs["data_collator"] = XMCDataCollator(tokenizer)
        if isinstance(kwargs.get("data_collator"), DataCollatorWithPadding):
            # It pads the token columns, and fails on the label-id lists, one length per example.
            kwargs["data_collator"] = LabelIdPadding(kwargs["data_collator"])
        # The verbosity `Trainer.__init__` sets from `log_level`, set before the plan logs what it chose.
        transformers_logging.set_verbosity(args.get_process_log_level())
        self.memory_plan = self._plan_memory(args, haste_model, sharded, kwargs.get("data_collator"))
        super().__init__(model, args, *trainer_args, **kwargs)
        if args.world_size > 1:
            # The Trainer seeds every rank alike, so the ranks drew the same dropout masks for their examples
            # (all of them wherever the padded lengths agree), where one process draws fresh ones for the
            # whole batch. Each rank takes its own stream, rank 0 the single process's; the data order
            # stays a function of `seed` through `data_seed`, which the sampler would otherwise take from
            # the torch seed.
            torch.manual_seed(args.seed + args.process_index)
        _warn_ignored_options(args)
        self.non_finite_guard = NonFiniteGradientCallback(args.on_non_finite)
        self.add_callback(self.non_finite_guard)
        tail = haste_model.output_layer.tail
        # Left to its default (None), rewiring passes over a tail that reads every feature: nothing to regrow.
        rewirable = tail is not None and (
            args.rewiring_interval is not None or tail.weight.shape[-1] < tail.in_features
        )
        if args.rewiring_interval != 0 and rewirable:
            rewiring = RewiringCallback(
                interval=args.rewiring_interval,
                fraction=args.rewiring_fraction,
                end_fraction=args.rewiring_end_fraction,
                scope=args.rewiring_scope,
                init=args.rewiring_init,
                seed=args.rewiring_seed,
                score=args.rewiring_score,
            )
            rewiring.check_model(self.model)
            self.add_callback(rewiring)

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        handler = getattr(self.accelerator, "ddp_handler", None)
        if DDP_TAKES_FORWARD_SYNC_BUFFERS and handler is not None:
            self.accelerator.ddp_handler = _ForwardSyncBuffersKwargs(handler)

    def _set_signature_columns_if_needed(self) -> None:
        """The columns `remove_unused_columns` keeps: the model's arguments, and the columns the collator reads (an
        `XMCDataCollator` tokenizes the raw `text` itself), so that a stock `TrainingArguments` trains on raw text."""
        if self._signature_columns is None:
            super()._set_signature_columns_if_needed()
            read = [getattr(self.data_collator, name, None) for name in ("text_column", "label_column")]
            self._signature_columns += [column for column in read if isinstance(column, str)]

    @staticmethod
    def _plan_memory(args: HasteTrainingArguments, model, sharded: bool, data_collator) -> memory_plan.MemoryPlan:
        """Resolves the memory options `args` left unset (`memory_plan`), writes them into `args`, and turns
        encoder checkpointing on where the plan chose it."""
        # The longest input the collator makes; else the encoder's own limit.
        tokens = getattr(data_collator, "max_length", None) or getattr(
            model.config.encoder, "max_position_embeddings", 512
        )
        plan = memory_plan.plan_memory(
            args, model, tokens=tokens, sharded=sharded, device_memory=memory_plan.device_memory_of(args.device)
        )
        args.output_momentum_dtype = plan.output_momentum_dtype
        args.output_chunked_backward = plan.output_chunked_backward
        args.output_fused_update = plan.output_fused_update
        if plan.checkpoint_every:
            # On the model, not through `args`: transformers releases read other fields and take `every_n_layers` or not.
            memory_plan.enable_encoder_checkpointing(model, plan.checkpoint_every)
        return plan

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        """`Trainer.train`; `resume_from_checkpoint=True` picks the last checkpoint that finished saving (a
        half-written or damaged one is passed over), and a checkpoint path given that did not finish is refused, as
        is a checkpoint of another model or of another training split. With `on_non_finite="skip"`, a run that
        skipped more than half of its steps raises a `FloatingPointError` at its end: the model it leaves is not a
        trained one, and the recipe does not save it."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = last_complete_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(f"No complete checkpoint to resume from in `output_dir` ({self.args.output_dir}).")
        elif resume_from_checkpoint and (problem := checkpoint_problem(resume_from_checkpoint)) is not None:
            earlier = last_complete_checkpoint(os.path.dirname(os.path.abspath(resume_from_checkpoint)))
            raise ValueError(
                f"{resume_from_checkpoint} is not a complete checkpoint ({problem})"
                + (f": resume from {earlier}." if earlier else ".")
            )
        if resume_from_checkpoint:
            self._check_resumable(resume_from_checkpoint)
        if self.optimizer is not None:  # a later call: `create_optimizer` will not run again
            self._chunk_output_layer_backward(True)
        try:
            output = super().train(resume_from_checkpoint, *args, **kwargs)
        finally:
            # The fused update steps this trainer's optimizer: the model, trained on elsewhere, must not.
            self._chunk_output_layer_backward(False)
        guard = self.non_finite_guard
        if guard.too_many_skipped:
            raise FloatingPointError(
                f"Training diverged: {guard.skipped_steps} of its {guard.steps} optimizer steps were skipped (NaN or "
                "infinite gradients), so the model barely trained and is not saved. Lower the learning rates "
                "(encoder and output layer), or check the data and the encoder's outputs."
            )
        return output

    def _run_epoch(self, *args, **kwargs):
        # transformers checks `max_steps` after a step, not before: a run that finished mid-epoch, resumed from its
        # last checkpoint (the way back after a failed final save), would train one step beyond its end.
        if self.state.global_step >= self.state.max_steps:
            self.control.should_training_stop = True
            return None
        return super()._run_epoch(*args, **kwargs)

    def _check_resumable(self, checkpoint: str) -> None:
        """Refuses a checkpoint of another model (its weights would not load) or of another training split (they
        would, and the run would continue on other labels in silence); warns when its optimizer state is missing."""
        differences = checkpoint_model_differences(checkpoint, unwrap_model(self.model).config)
        if differences:
            raise ValueError(
                f"{checkpoint} is a checkpoint of another model: its {'; its '.join(differences)}. Resume it with the "
                "settings it was trained with, or start afresh (--overwrite-output-dir)."
            )
        self._check_label_names(checkpoint)
        saved = TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE_NAME)).stateful_callbacks or {}
        saved = saved.get(TrainingSplitFingerprint.__name__)
        ours = next((cb for cb in self.callback_handler.callbacks if isinstance(cb, TrainingSplitFingerprint)), None)
        if (
            isinstance(saved, dict)
            and ours is not None
            and saved.get("args", {}).get("fingerprint") != ours.fingerprint
        ):
            raise ValueError(
                f"{checkpoint} was trained on another training split (the fingerprint of its label plan differs): resume "
                "it with the data, --validation-fraction and --seed it was trained with, or start afresh (--overwrite-output-dir)."
            )
        missing = [
            name for name in (OPTIMIZER_NAME, SCHEDULER_NAME) if not os.path.isfile(os.path.join(checkpoint, name))
        ]
        if missing:
            logger.warning(
                f"{checkpoint} holds no {' and no '.join(missing)}: the run resumes its weights with FRESH optimizer "
                "state (no momentum, the learning-rate schedule from its start), so it will not continue as the "
                "interrupted run would have."
            )

    def _check_label_names(self, checkpoint: str) -> None:
        """Refuses a checkpoint trained under other label names than this run's model holds (same count, other
        names or order: the weights would continue under the wrong names)."""
        check_label_names(checkpoint, unwrap_model(self.model).label_names)

    def create_optimizer(self, model=None) -> torch.optim.Optimizer:
        if self.optimizer is None:
            model = unwrap_model(self.model if model is None else model)
            args = self.args
            encoder_side, _ = split_parameters(model)
            decay_names = set(self.get_decay_parameter_names(model))
            encoder_groups = [
                {"params": [p for n, p in encoder_side if n in decay_names], "weight_decay": args.weight_decay},
                {"params": [p for n, p in encoder_side if n not in decay_names], "weight_decay": 0.0},
            ]
            encoder_optimizer = torch.optim.AdamW(
                [group for group in encoder_groups if group["params"]],
                lr=args.learning_rate,
                betas=(args.adam_beta1, args.adam_beta2),
                eps=args.adam_epsilon,
            )
            output_optimizer = StochasticRoundingSGD(
                output_parameter_groups(model, args.output_learning_rate, args.output_tail_lr_scale),
                lr=args.output_learning_rate,
                momentum=args.output_momentum,
                weight_decay=args.output_weight_decay,
                stochastic_rounding=args.output_stochastic_rounding,
                momentum_dtype=getattr(torch, args.output_momentum_dtype),
                # Replicas must round alike; shards hold different weights, so each takes its own bits.
                seed=args.seed if self.sharded_output_layer is None else hash((args.seed, args.process_index)),
            )
            self.optimizer = HasteOptimizer(encoder_optimizer, output_optimizer)
            self._chunk_output_layer_backward(True)
        return self.optimizer

    def _chunk_output_layer_backward(self, enable: bool) -> None:
        """`output_chunked_backward` and `output_fused_update` (on while training): the loss backward of the head
        and tail weights (the parameters the loss reads whole; biases keep their gradients) by label chunks,
        each chunk's SGD step applied where its gradient is computed (`losses.chunk_loss_backward_`)."""
        args = self.args
        if not (args.output_chunked_backward or args.output_fused_update) or self.optimizer is None:
            return
        if args.output_fused_update and args.world_size > 1 and self.sharded_output_layer is None:
            raise ValueError(
                "`output_fused_update` needs the output layer split over the processes (`shard_output_layer`): a "
                "replicated one must all-reduce its whole gradient before the step."
            )
        output_optimizer = unwrap_haste_optimizer(self.optimizer).output_optimizer
        for param in (param for group in output_optimizer.param_groups for param in group["params"]):
            if param.dim() >= 2:
                update = functools.partial(output_optimizer.update_rows_, param) if args.output_fused_update else None
                chunk_loss_backward_(param, args.output_loss_chunk_labels if enable else None, update)

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None):
        if self.lr_scheduler is None:
            args = self.args
            self.lr_scheduler = get_haste_scheduler(
                self.optimizer if optimizer is None else optimizer,
                num_training_steps,
                encoder_scheduler_type=args.lr_scheduler_type,
                encoder_warmup=args.warmup_steps,
                output_scheduler_type=args.output_lr_scheduler_type,
                output_warmup=args.output_warmup_steps,
                encoder_scheduler_kwargs=args.lr_scheduler_kwargs or None,
                output_scheduler_kwargs=args.output_lr_scheduler_kwargs or None,
            )
            self._created_lr_scheduler = True
        return self.lr_scheduler

    def _clip_grad_norm(self, model):
        """Clips the encoder side to `max_grad_norm` and the output layer to `output_max_grad_norm` apart
        (see `HasteTrainingArguments`); returns the encoder side's norm, which the Trainer logs."""
        haste_model = unwrap_model(model)
        encoder_side, _ = split_parameters(haste_model)
        # Through accelerate first: it unscales all gradients (fp16) before measuring.
        encoder_norm = self.accelerator.clip_grad_norm_([p for _, p in encoder_side], self.args.max_grad_norm)
        if self.args.output_max_grad_norm > 0:
            haste_model.output_layer.clip_grad_norm_(self.args.output_max_grad_norm)
        return encoder_norm

    @property
    def sharded_output_layer(self):
        """The model's output layer when this rank holds a share of it, else None."""
        return sharded_output_layer(unwrap_model(self.model))

    def _get_learning_rate(self) -> float:
        # The Trainer reads the rate here, before stepping the schedule, and logs it as `learning_rate`
        # (the encoder's); the output layer's rate, on its own schedule, is read at the same moment.
        self._output_learning_rate = unwrap_haste_optimizer(self.optimizer).output_optimizer.param_groups[0]["lr"]
        return super()._get_learning_rate()

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "learning_rate" in logs:
            logs["output_learning_rate"] = self._output_learning_rate
            if self.non_finite_guard.skipped_steps:
                logs["skipped_steps"] = self.non_finite_guard.skipped_steps
        # A rewiring at this step left its count in the history (see RewiringCallback): log it with the rest.
        last = self.state.log_history[-1] if self.state.log_history else {}
        if set(last) == {"rewired_pairs", "step"} and last["step"] == self.state.global_step:
            logs["rewired_pairs"] = self.state.log_history.pop()["rewired_pairs"]
        super().log(logs, start_time)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Loss, the `eval_top_k` best label ids and the padded label ids of one evaluation batch."""
        inputs = self._prepare_inputs(inputs)
        labels = inputs.get("labels")
        with torch.no_grad(), self.compute_loss_context_manager():
            # A model of fewer labels than `eval_top_k` ranks them all.
            top_k = min(self.args.eval_top_k, unwrap_model(model).config.label_count)
            outputs = model(**inputs, return_logits=False, top_k=None if prediction_loss_only else top_k)
        loss = None if outputs.loss is None else outputs.loss.detach().mean()
        if prediction_loss_only:
            return loss, None, None
        return loss, outputs.top_label_ids, labels

    # A sharded run saves without gathering its output layer: each rank writes its rows (and, in a checkpoint, their
    # momentum) into a file of its own and reads back the rows it owns, at any world size (`shard_checkpoints`). The
    # save is collective, so it runs in `save_model`, which every rank enters whichever ranks this transformers then
    # calls `_save` on (5.10 and 5.17 on the main process only, 5.24 on every rank); `_save` is not used.

    def _save_checkpoint(self, model, trial) -> None:
        self._checkpoint_momentum = not self.args.save_only_model
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._checkpoint_momentum = False

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """`Trainer.save_model`; a sharded model is saved by every rank (call it on every rank)."""
        if self.sharded_output_layer is None:
            return super().save_model(output_dir, _internal_call)
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        with_momentum = getattr(self, "_checkpoint_momentum", False) and self.optimizer is not None
        output_optimizer = unwrap_haste_optimizer(self.optimizer).output_optimizer if with_momentum else None
        save_sharded_folder(unwrap_model(self.model), output_dir, self._write_tokenizer_and_arguments, output_optimizer)
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)
        return None

    def _write_tokenizer_and_arguments(self, folder: str) -> None:
        """What `Trainer._save` writes beside the model: the tokenizer and the training arguments."""
        tokenizer = self.processing_class
        tokenizer = getattr(self.data_collator, "tokenizer", None) if tokenizer is None else tokenizer
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        torch.save(self.args, os.path.join(folder, TRAINING_ARGS_NAME))

    def _save(self, output_dir: str | None = None, state_dict=None):
        if self.sharded_output_layer is not None:
            raise RuntimeError("A sharded model is saved through `save_model`, on every rank.")
        return super()._save(output_dir, state_dict)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        if self.sharded_output_layer is None:
            return super()._save_optimizer_and_scheduler(output_dir)
        if self.args.should_save:  # the output layer's momentum is in the shards `save_model` wrote
            optimizer = unwrap_haste_optimizer(self.optimizer)
            output = output_optimizer_state_to_save(unwrap_model(self.model), optimizer.output_optimizer)
            state = {"encoder": optimizer.encoder_optimizer.state_dict(), "output": output}
            torch.save(state, os.path.join(output_dir, OPTIMIZER_NAME))
            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))
        return None

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        with _reading(checkpoint, f"{OPTIMIZER_NAME} or {SCHEDULER_NAME}"):
            self._load_optimizer_and_scheduler_files(checkpoint)

    def _reads_rows_itself(self, checkpoint: str | None) -> bool:
        """Whether loading `checkpoint` needs `shard_checkpoints`: this run is sharded, or the checkpoint is."""
        return checkpoint is not None and (
            self.sharded_output_layer is not None or os.path.isfile(os.path.join(checkpoint, OUTPUT_SHARDS_INDEX))
        )

    def _load_optimizer_and_scheduler_files(self, checkpoint: str | None) -> None:
        if not self._reads_rows_itself(checkpoint):
            return super()._load_optimizer_and_scheduler(checkpoint)
        optimizer_file, scheduler_file = (
            os.path.join(checkpoint, OPTIMIZER_NAME),
            os.path.join(checkpoint, SCHEDULER_NAME),
        )
        if not (os.path.isfile(optimizer_file) and os.path.isfile(scheduler_file)):
            return
        # Memory-mapped: a checkpoint of an earlier version holds the whole momentum, of which a rank reads its rows.
        state = torch.load(optimizer_file, map_location="cpu", weights_only=True, mmap=True)
        optimizer = unwrap_haste_optimizer(self.optimizer)
        in_shards = state["output"].pop(ROWS_IN_SHARDS_KEY, None)
        if in_shards is None and self.sharded_output_layer is not None:
            state["output"] = self.sharded_output_layer.local_optimizer_state(state["output"])
        optimizer.load_state_dict(state)
        if in_shards is not None:
            load_output_momentum_(unwrap_model(self.model), optimizer.output_optimizer, in_shards, checkpoint)
        self.lr_scheduler.load_state_dict(torch.load(scheduler_file, weights_only=True))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        with _reading(resume_from_checkpoint, "weights"):
            if not self._reads_rows_itself(resume_from_checkpoint):
                return super()._load_from_checkpoint(resume_from_checkpoint, model)
            load_folder_rows_(unwrap_model(self.model if model is None else model), resume_from_checkpoint)

    def _load_best_model(self) -> None:
        if not self._reads_rows_itself(self.state.best_model_checkpoint):
            return super()._load_best_model()
        load_folder_rows_(unwrap_model(self.model), self.state.best_model_checkpoint)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        # Trainer copies only the config and weights of the checkpoint into the folder it pushes; the config
        # names the exported code in `auto_map`, so the code goes along.
        from ..hub import trainer_uploads_without_internal_files

        if self.is_world_process_zero():
            self._check_publishable_output_dir()
            for path in exported_code_files():
                shutil.copyfile(path, os.path.join(self.args.output_dir, os.path.basename(path)))
            shards = OutputShards.open(checkpoint_folder)  # a sharded run's output layer, which it copies not
            for name in [] if shards is None else [OUTPUT_SHARDS_INDEX, *(shard["file"] for shard in shards.shards)]:
                shutil.copyfile(os.path.join(checkpoint_folder, name), os.path.join(self.args.output_dir, name))
        with trainer_uploads_without_internal_files():
            super()._push_from_checkpoint(checkpoint_folder)

    def push_to_hub(self, *args, **kwargs):
        """`Trainer.push_to_hub`, refusing an `output_dir` that holds a link (the upload would publish its target)
        and leaving out the marks of the program's saves (`.haste-*`)."""
        from ..hub import trainer_uploads_without_internal_files

        if self.is_world_process_zero():
            self._check_publishable_output_dir()
        with trainer_uploads_without_internal_files():
            return super().push_to_hub(*args, **kwargs)

    def _check_publishable_output_dir(self) -> None:
        from ..hub import INTERNAL_PATTERNS, publishable_files

        # What Trainer's uploads of `output_dir` leave out.
        publishable_files(self.args.output_dir, ["_*", f"{PREFIX_CHECKPOINT_DIR}-*", *INTERNAL_PATTERNS])

    def create_model_card(
        self,
        model_name: str | None = None,
        tags: str | list[str] | None = None,
        license: str | None = None,
        dataset: str | list[str] | None = None,
        **unused_trainer_fields,
    ) -> None:
        """Writes the HASTE model card (both optimizers, sparsity, grouping, rewiring, metrics) to
        `output_dir/README.md` instead of the generic one, which would name a single optimizer. Takes the
        arguments of `Trainer.create_model_card`; those the HASTE card has no place for are not used."""
        if not self.is_world_process_zero():
            return
        from ..model_card import HasteModelCardData, write_model_card

        fields = {}
        if model_name is not None and not self.args.hub_model_id:
            fields["model_id"] = model_name
        if license is not None:
            fields["license"] = license
        if dataset is not None:
            fields["dataset_name"] = dataset if isinstance(dataset, str) else ", ".join(dataset)
        card_data = HasteModelCardData.from_trainer(self, **fields)
        extra_tags = [tags] if isinstance(tags, str) else tags or []
        card_data.tags = list(dict.fromkeys([*card_data.tags, *extra_tags]))
        write_model_card(card_data, os.path.join(self.args.output_dir, "README.md"))
