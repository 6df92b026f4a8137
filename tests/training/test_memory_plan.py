"""The memory options chosen where the user left them unset (haste_hf.memory_plan): the resolver on its own, its
calibration against the measured peaks, and through `HasteTrainer`, the command line and `haste_hf.train`."""

import dataclasses
import logging
import types
import warnings

import pytest
import torch
from datasets import Dataset
from tiny_encoders import planted_texts, tiny_encoder_config, tiny_tokenizer
from tiny_haste import make_tiny_model, make_tiny_trainer

from haste_hf.cli.parser import parse_args
from haste_hf.training import memory_plan
from haste_hf.training.memory_plan import partial_checkpointing_supported, plan_memory, planned_peak_bytes
from haste_hf.training.training_args import HasteTrainingArguments


GPU = 80 * 2**30
PLAN_LOGGER = "transformers.haste_hf.training.memory_plan"
OPTIONS = ("output_momentum_dtype", "output_chunked_backward", "output_fused_update")


def arguments(tmp_path, **fields):
    return HasteTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], **fields)


def chosen(plan):
    return tuple(getattr(plan, name) for name in OPTIONS) + (plan.checkpoint_every,)


def test_nothing_given_on_a_gpu_with_a_bf16_output_layer_turns_the_output_options_on(tmp_path):
    args = arguments(tmp_path, output_layer_dtype="bfloat16")
    plan = plan_memory(args, make_tiny_model(), tokens=16, sharded=False, device_memory=GPU)
    assert chosen(plan) == ("bfloat16", True, True, 0)


@pytest.mark.parametrize(
    "device_memory, layer_dtype",
    [(None, "bfloat16"), (None, None), (GPU, None), (GPU, "float32")],
    ids=["cpu-bf16-layer", "cpu", "gpu-fp32-layer", "gpu-fp32-layer-asked"],
)
def test_off_on_a_cpu_and_for_an_fp32_output_layer(tmp_path, device_memory, layer_dtype):
    """The options were measured with a bf16 output layer on a GPU: elsewhere nothing is turned on."""
    args = arguments(tmp_path, output_layer_dtype=layer_dtype)
    plan = plan_memory(args, make_tiny_model(), tokens=16, sharded=False, device_memory=device_memory)
    assert chosen(plan) == ("float32", False, False, 0)


def test_given_values_are_kept(tmp_path):
    args = arguments(
        tmp_path,
        output_layer_dtype="bfloat16",
        output_momentum_dtype="float32",
        output_chunked_backward=False,
        output_fused_update=False,
        gradient_checkpointing=False,
    )
    plan = plan_memory(args, make_tiny_model(), tokens=16, sharded=False, device_memory=1)  # a GPU of 1 byte
    assert chosen(plan) == ("float32", False, False, None)  # None: the Trainer applies the user's own setting
    cpu = arguments(tmp_path, output_momentum_dtype="bfloat16", output_chunked_backward=True, output_fused_update=True)
    assert chosen(plan_memory(cpu, make_tiny_model(), tokens=16, sharded=False, device_memory=None))[:3] == (
        "bfloat16",
        True,
        True,
    )


@pytest.mark.parametrize(
    "fields, named",
    [
        (dict(gradient_accumulation_steps=2), "gradient_accumulation_steps=2"),
        (dict(output_max_grad_norm=1.0), "output_max_grad_norm=1.0"),
        (dict(on_non_finite="skip"), "on_non_finite='skip'"),
    ],
)
def test_what_the_fused_update_cannot_serve_turns_it_off_with_one_line_unless_asked(tmp_path, caplog, fields, named):
    args = arguments(tmp_path, output_layer_dtype="bfloat16", **fields)
    with caplog.at_level(logging.INFO, logger="transformers.haste_hf.training.memory_plan"):
        plan = plan_memory(args, make_tiny_model(), tokens=16, sharded=False, device_memory=GPU)
    assert chosen(plan) == ("bfloat16", True, False, 0)
    lines = [record.getMessage() for record in caplog.records if "output_fused_update" in record.getMessage()]
    assert len(lines) == 1 and named in lines[0]
    with pytest.raises(ValueError, match=f"`output_fused_update`.*`{named.split('=')[0]}="):
        arguments(tmp_path, output_layer_dtype="bfloat16", output_fused_update=True, **fields)


def test_a_replicated_output_layer_on_several_processes_takes_no_fused_update(tmp_path, caplog):
    args = arguments(tmp_path, output_layer_dtype="bfloat16")
    several = types.SimpleNamespace(**{**vars(args), "world_size": 2})
    with caplog.at_level(logging.INFO, logger="transformers.haste_hf.training.memory_plan"):
        replicated = plan_memory(several, make_tiny_model(), tokens=16, sharded=False, device_memory=GPU)
        sharded = plan_memory(several, make_tiny_model(), tokens=16, sharded=True, device_memory=GPU)
    assert not replicated.output_fused_update and sharded.output_fused_update
    assert "replicated output layer" in caplog.text


@pytest.mark.parametrize("checkpointing", [None, False], ids=["planned", "checkpointing-given"])
def test_no_momentum_counts_no_bytes_and_the_line_says_so(tmp_path, caplog, checkpointing):
    """`output_momentum=0` keeps no buffer: the planned peak is smaller by exactly the bf16 momentum of the output
    layer's parameters (2 bytes each), and the plan's line says "no momentum", not a dtype."""
    model = make_tiny_model()
    parameters = sum(param.numel() for param in model.output_layer.parameters())
    fields = dict(output_layer_dtype="bfloat16", output_fused_update=False, gradient_checkpointing=checkpointing)
    fields = {name: value for name, value in fields.items() if value is not None}
    lines = {}
    plans = {}
    for momentum in (0.9, 0.0):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=PLAN_LOGGER):
            plans[momentum] = plan_memory(
                arguments(tmp_path, output_momentum=momentum, **fields),
                model,
                tokens=16,
                sharded=False,
                device_memory=GPU,
            )
        lines[momentum] = [record.getMessage() for record in caplog.records if record.name == PLAN_LOGGER]
    assert len(lines[0.0]) == 1 and lines[0.0][0].startswith("Memory plan: output layer no momentum, chunked backward")
    assert lines[0.9][0].startswith("Memory plan: output layer momentum bfloat16, chunked backward")
    if checkpointing is None:  # (with checkpointing given, the plan plans no peak)
        assert plans[0.9].planned_peak - plans[0.0].planned_peak == 2 * parameters
    assert plans[0.9].momentum_buffer and not plans[0.0].momentum_buffer


def peaks(model, **fields):
    every = (0, 4, 3, 2, 1)
    common = dict(batch_size=8, tokens=16, loss_rows=8, momentum_dtype="bfloat16", momentum=True, autocast_bf16=False)
    return {
        n: planned_peak_bytes(model, chunked_backward=True, fused_update=True, checkpoint_every=n, **common)
        for n in every
    }


def test_checkpointing_only_where_the_planned_peak_does_not_fit_and_for_as_few_blocks_as_fit(tmp_path):
    encoder = tiny_encoder_config("bert")
    encoder.num_hidden_layers = 4
    model = make_tiny_model(encoder=encoder)
    args = arguments(tmp_path, output_layer_dtype="bfloat16", per_device_train_batch_size=8)
    planned = peaks(model)
    assert planned[0] > planned[2] > planned[1]  # each block checkpointed keeps only its input
    room = memory_plan.DEVICE_MEMORY_SHARE
    fits_all = plan_memory(args, model, tokens=16, sharded=False, device_memory=int(planned[0] / room) + 1)
    assert fits_all.checkpoint_every == 0
    between = int((planned[2] + 1) / room) + 1  # every 2nd block fits, none does not
    choices = memory_plan.CHECKPOINT_CHOICES if partial_checkpointing_supported() else (0, 1)
    expected = next(every for every in choices if planned[every] <= room * between)  # the cheapest that fits
    assert expected == (3 if partial_checkpointing_supported() else 1)  # 2 of the 4 blocks (every 3rd: 0 and 3)
    assert plan_memory(args, model, tokens=16, sharded=False, device_memory=between).checkpoint_every == expected
    assert plan_memory(args, model, tokens=16, sharded=False, device_memory=1).checkpoint_every == 1  # and a warning
    given = arguments(tmp_path, output_layer_dtype="bfloat16", gradient_checkpointing=False)
    assert plan_memory(given, model, tokens=16, sharded=False, device_memory=1).checkpoint_every is None


def test_the_plan_matches_the_peaks_measured_at_8_6m_labels():
    """benchmarks/step.py on an H100 (issue 28): MPNet-base, batch 128 x 128 tokens, G 32, F 64, head 3%, a bf16
    output layer: 18.7 GiB with every option off, 13.0 with bf16 momentum + chunked backward + fused update, 9.3
    with every 2nd block checkpointed too, 5.8 with every block. The plan is within 10% of each."""
    from transformers import MPNetConfig

    from haste_hf import HasteConfig, HasteForExtremeClassification

    labels = 8_600_000
    encoder = MPNetConfig(
        vocab_size=30527, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072
    )
    config = HasteConfig(
        encoder=encoder, label_count=labels, head_label_count=round(0.03 * labels), group_size=32, fan_in=64
    )
    with torch.device("meta"):
        model = HasteForExtremeClassification(config)
    for module in (model.output_layer.head, model.output_layer.tail):
        module.to(torch.bfloat16)
    common = dict(batch_size=128, tokens=128, loss_rows=128, momentum=True, autocast_bf16=True)
    lean = dict(momentum_dtype="bfloat16", chunked_backward=True, fused_update=True)
    off = dict(momentum_dtype="float32", chunked_backward=False, fused_update=False)
    measured = [(off, 0, 18.7), (lean, 0, 13.0), (lean, 2, 9.3), (lean, 1, 5.8)]
    for options, every, gib in measured:
        planned = planned_peak_bytes(model, checkpoint_every=every, **options, **common) / 2**30
        assert planned == pytest.approx(gib, rel=0.1), (options, every)


def test_the_trainer_takes_the_plan_into_its_own_arguments(tmp_path, monkeypatch):
    """A "GPU" of 1 MiB (the tiny model's planned peak is more): checkpointing of every block, the output options on,
    and a few steps train with all of them; the caller's arguments still say "not given"."""
    monkeypatch.setattr(memory_plan, "device_memory_of", lambda device: 2**20)
    tokenizer = tiny_tokenizer(tmp_path / "tokenizer")
    trainer = make_tiny_trainer(
        tmp_path / "run",
        tokenizer,
        Dataset.from_list(planted_texts(40, 32)),
        output_layer_dtype="bfloat16",
        max_steps=2,
    )
    assert chosen(trainer.memory_plan) == ("bfloat16", True, True, 1)
    assert [getattr(trainer.args, name) for name in OPTIONS] == ["bfloat16", True, True]
    assert trainer.model.is_gradient_checkpointing
    trainer.train()
    assert trainer.model.output_layer.tail.weight.grad is None  # the fused update stepped it inside the backward


def test_the_plan_says_in_one_line_what_it_chose_and_why_and_checkpoints_through_the_current_call(
    tmp_path, monkeypatch, caplog
):
    """A GPU where the tiny model's planned peak does not fit: one info line names the choice, the planned peak and
    the GPU's memory; turning checkpointing on warns of no deprecated call (transformers 5.24 renamed it)."""
    tokenizer = tiny_tokenizer(tmp_path / "tokenizer")
    data = Dataset.from_list(planted_texts(40, 8))
    monkeypatch.setattr(memory_plan, "device_memory_of", lambda device: 2**20)
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO, logger=PLAN_LOGGER):
        warnings.simplefilter("always")
        trainer = make_tiny_trainer(tmp_path / "run", tokenizer, data, output_layer_dtype="bfloat16", max_steps=1)
    assert trainer.model.is_gradient_checkpointing
    assert [str(warning.message) for warning in caught if issubclass(warning.category, FutureWarning)] == []
    # (and a warning: at 1 MiB even every block checkpointed does not fit)
    lines = [
        record.getMessage()
        for record in caplog.records
        if record.name == PLAN_LOGGER and record.levelno == logging.INFO
    ]
    peak = trainer.memory_plan.planned_peak / 2**30
    assert lines == [
        "Memory plan: output layer momentum bfloat16, chunked backward on, fused update on (a bf16 output layer on a "
        f"GPU, options not given); encoder checkpointing of every block (planned peak {peak:.1f} GiB; with fewer "
        "blocks it exceeds 85% of the GPU's 0.0 GiB)."
    ]
    caplog.clear()
    monkeypatch.setattr(memory_plan, "device_memory_of", lambda device: None)
    with caplog.at_level(logging.INFO, logger=PLAN_LOGGER):
        make_tiny_trainer(tmp_path / "cpu", tokenizer, data, max_steps=1)
    assert [
        record.getMessage()
        for record in caplog.records
        if record.name == PLAN_LOGGER and record.levelno == logging.INFO
    ] == [
        "Memory plan: output layer momentum float32, chunked backward off, fused update off; no encoder "
        "checkpointing (a CPU: no device memory to plan against)."
    ]


def test_log_level_info_shows_the_plan(tmp_path, caplog):
    """transformers' `log_level` (`--log-level info`) shows the plan's line, as it shows the Trainer's own."""
    from transformers.utils import logging as transformers_logging

    verbosity = transformers_logging.get_verbosity()
    try:
        tokenizer = tiny_tokenizer(tmp_path / "tokenizer")
        make_tiny_trainer(tmp_path / "run", tokenizer, Dataset.from_list(planted_texts(40, 8)), log_level="info")
    finally:
        transformers_logging.set_verbosity(verbosity)
    assert [record.levelno for record in caplog.records if record.getMessage().startswith("Memory plan:")] == [
        logging.INFO
    ]


def test_on_a_cpu_the_trainer_chooses_nothing(tmp_path):
    """Without a GPU: float32 momentum, no chunked backward, no fused update, no checkpointing (see memory_plan);
    the caller's arguments keep saying "not given"."""
    from haste_hf import HasteTrainer
    from haste_hf.data import XMCDataCollator

    args = arguments(tmp_path, max_steps=1)
    trainer = HasteTrainer(
        model=make_tiny_model(),
        args=args,
        train_dataset=Dataset.from_list(planted_texts(40, 8)),
        data_collator=XMCDataCollator(tiny_tokenizer(tmp_path / "tokenizer"), max_length=16),
    )
    assert chosen(trainer.memory_plan) == ("float32", False, False, 0)
    assert [getattr(trainer.args, name) for name in OPTIONS] == ["float32", False, False]
    assert not trainer.model.is_gradient_checkpointing
    assert [getattr(args, name) for name in OPTIONS] == [None, None, None]


def test_not_given_reads_apart_from_an_explicit_value_on_the_command_line_and_in_the_api(tmp_path):
    from haste_hf.recipe import _training_arguments

    unset = parse_args(["train", "--use-cpu"]).training
    api, _ = _training_arguments({"use_cpu": True}, str(tmp_path), has_validation=False)
    for args in (unset, api):
        assert [getattr(args, name) for name in OPTIONS] == [None, None, None] and not args._checkpointing_given
    alone = parse_args(
        ["train", "--use-cpu", "--output-fused-update", "--output-chunked-backward", "--gradient-checkpointing"]
    )
    assert alone.training.output_fused_update is True and alone.training.output_chunked_backward is True
    assert alone.training._checkpointing_given and alone.training.gradient_checkpointing
    off = parse_args(["train", "--use-cpu", "--output-fused-update", "false", "--gradient-checkpointing", "false"])
    assert off.training.output_fused_update is False and off.training._checkpointing_given
    copied = dataclasses.replace(arguments(tmp_path), output_fused_update=False)
    assert copied.output_chunked_backward is None and copied.output_fused_update is False


def test_the_output_layer_counts_its_weights_gradients_momentum_and_logits_in_bytes(monkeypatch):
    """The plan's output-layer terms, each against the bytes counted by hand from the layer's shape: a head of 4
    rows over 32 features (weights and biases) and a tail of 9 groups of 4 labels of 8 weights: 420 weights; the
    logits of 8 rows over 4 + 36 columns (padding slots included), 100 elements a chunk."""
    model = make_tiny_model(label_count=40, head_label_count=4, group_size=4, fan_in=8)  # float32 output layer
    layer = model.output_layer
    assert (layer.in_features, layer.tail_group_count) == (32, 9) and layer.tail.bias is None
    monkeypatch.setattr(memory_plan, "DEFAULT_LOSS_CHUNK_ELEMENTS", 100)
    common = dict(batch_size=8, tokens=16, loss_rows=8, checkpoint_every=0, autocast_bf16=False)

    def peak(**options):
        return planned_peak_bytes(model, **{**common, **options})

    lean = dict(momentum_dtype="float32", momentum=False, chunked_backward=True)
    assert peak(**lean, fused_update=False) - peak(**lean, fused_update=True) == 1680  # float32 gradients
    fused = dict(chunked_backward=True, fused_update=True)
    no_momentum = peak(**fused, momentum=False, momentum_dtype="float32")
    assert peak(**fused, momentum=True, momentum_dtype="float32") - no_momentum == 1680
    assert peak(**fused, momentum=True, momentum_dtype="bfloat16") - no_momentum == 840
    whole = dict(momentum_dtype="float32", momentum=False, fused_update=False)
    # 8 x 40 logits of WHOLE_LOGIT_BYTES each against a chunk of 100 float32 elements.
    assert memory_plan.WHOLE_LOGIT_BYTES == 4
    assert peak(**whole, chunked_backward=False) - peak(**whole, chunked_backward=True) == 8 * 40 * 4 - 400
    before = peak(**lean, fused_update=True)
    layer.head.weight.data = layer.head.weight.data.bfloat16()  # 128 weights of 2 bytes instead of 4
    assert before - peak(**lean, fused_update=True) == 256


def test_the_output_layer_counts_its_supports_and_label_ids_by_dtype(monkeypatch):
    """The output layer's buffers against the bytes counted by hand: the tail's supports, 9 groups x 8 int32 (288),
    the label ids of its 4 + 36 positions in int64 (320); a rank's share adds the sorted lookup of its ids, an int32
    id and an int32 position each (320)."""
    model = make_tiny_model(label_count=40, head_label_count=4, group_size=4, fan_in=8)
    layer = model.output_layer
    assert layer.tail.supports.dtype == torch.int32 and layer.output_labels.dtype == torch.int64
    assert memory_plan.output_buffer_bytes(layer, sharded=False) == 288 + 320
    assert memory_plan.output_buffer_bytes(layer, sharded=True) == 288 + 320 + 320
    common = dict(batch_size=8, tokens=16, loss_rows=8, checkpoint_every=0, autocast_bf16=False, momentum=True)
    options = dict(momentum_dtype="float32", chunked_backward=True, fused_update=True, **common)
    with_buffers = planned_peak_bytes(model, sharded=True, **options)
    assert with_buffers - planned_peak_bytes(model, sharded=False, **options) == 320
    monkeypatch.setattr(memory_plan, "output_buffer_bytes", lambda layer, sharded: 0)
    assert with_buffers - planned_peak_bytes(model, sharded=True, **options) == 928


@pytest.mark.parametrize(
    "every, expected", [(1, [True] * 4), (2, [True, False, True, False]), (3, [True, False, False, True])]
)
def test_encoder_checkpointing_of_every_nth_block(every, expected):
    encoder = tiny_encoder_config("bert")
    encoder.num_hidden_layers = 4
    model = make_tiny_model(label_count=20, encoder=encoder)
    if every != 1 and not partial_checkpointing_supported():  # the floor's call checkpoints every block only
        with pytest.raises(ValueError, match=f"every {every}-th encoder block needs .*every_n_layers"):
            memory_plan.enable_encoder_checkpointing(model, every)
        assert not any(layer.gradient_checkpointing for layer in model.encoder.encoder.layer)
        return
    memory_plan.enable_encoder_checkpointing(model, every)
    assert [layer.gradient_checkpointing for layer in model.encoder.encoder.layer] == expected


def test_device_memory_is_a_gpus_total_and_none_on_a_cpu(monkeypatch):
    asked = []
    properties = lambda device: asked.append(device) or types.SimpleNamespace(total_memory=80 * 2**30)  # noqa: E731
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    assert memory_plan.device_memory_of(torch.device("cuda", 1)) == 80 * 2**30 and asked == [torch.device("cuda", 1)]
    assert memory_plan.device_memory_of(torch.device("cpu")) is None and len(asked) == 1


def test_a_size_the_encoders_config_does_not_name_counts_no_activations(monkeypatch):
    """The activations are planned from the encoder config's layers, hidden size and heads; a config that names no
    hidden size (not a transformer's, or one spelled otherwise) gets no bytes per hidden unit guessed for it: planned
    as a hidden size of 0, the attention part alone."""
    from types import SimpleNamespace

    model = make_tiny_model()
    common = dict(
        batch_size=8,
        tokens=16,
        loss_rows=8,
        momentum_dtype="float32",
        momentum=True,
        chunked_backward=False,
        fused_update=False,
        checkpoint_every=0,
        autocast_bf16=False,
    )
    planned = {}
    for name, encoder in (
        ("unnamed", SimpleNamespace(num_hidden_layers=2, num_attention_heads=2)),
        ("zero", SimpleNamespace(num_hidden_layers=2, num_attention_heads=2, hidden_size=0)),
        ("no layers", SimpleNamespace()),
    ):
        monkeypatch.setattr(model.config, "encoder", encoder)
        planned[name] = planned_peak_bytes(model, **common)
    attention = 2 * 2 * 8 * 16 * memory_plan.ATTENTION_BYTES_PER_HEAD_TOKEN * 2 * 16  # fp32: twice the bf16 bytes
    assert planned["unnamed"] == planned["zero"] == planned["no layers"] + attention


@pytest.mark.parametrize("partial", [True, False])
def test_checkpointing_every_block_needs_no_partial_checkpointing_every_other_does(monkeypatch, partial):
    calls = []
    model = types.SimpleNamespace(**{memory_plan.CHECKPOINTING_ENABLE: lambda **kwargs: calls.append(kwargs)})
    monkeypatch.setattr(memory_plan, "partial_checkpointing_supported", lambda: partial)
    memory_plan.enable_encoder_checkpointing(model, 1)
    assert calls == [{}]
    if partial:
        memory_plan.enable_encoder_checkpointing(model, 3)
        assert calls == [{}, {"every_n_layers": 3}]
    else:
        with pytest.raises(ValueError, match="Checkpointing every 3-th encoder block needs a transformers whose"):
            memory_plan.enable_encoder_checkpointing(model, 3)
