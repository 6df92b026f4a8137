import pickle
import types
from functools import partial

import numpy as np
import pytest
import torch
from datasets import Dataset
from huggingface_hub import ModelCard
from tiny_encoders import planted_texts
from tiny_haste import make_tiny_model, make_tiny_trainer
from transformers import TrainerCallback

from haste_hf.data import XMCDataCollator
from haste_hf.metrics import Propensity, make_compute_metrics
from haste_hf.training.optimization import StochasticRoundingSGD, unwrap_haste_optimizer
from haste_hf.training.trainer import HasteTrainer
from haste_hf.training.training_args import HasteTrainingArguments


LABELS = 40


make_model = partial(make_tiny_model, label_count=LABELS, tail_projection_dim=16)


@pytest.fixture(scope="module")
def datasets_():
    return Dataset.from_list(planted_texts(LABELS, 96, seed=0)), Dataset.from_list(planted_texts(LABELS, 32, seed=1))


make_trainer = partial(
    make_tiny_trainer,
    model_fields=dict(label_count=LABELS, tail_projection_dim=16),
    per_device_train_batch_size=4,
    per_device_eval_batch_size=8,
    gradient_accumulation_steps=2,
    max_steps=8,
    save_strategy="steps",
    save_steps=4,
    logging_steps=1,
    learning_rate=1e-3,
    warmup_steps=2,
    output_learning_rate=0.1,
    output_warmup_steps=1,
    rewiring_interval=3,
    rewiring_fraction=0.25,
    max_grad_norm=1.0,
)


def test_two_optimizers_split_the_parameters(tmp_path, tokenizer, datasets_):
    trainer = make_trainer(tmp_path, tokenizer, datasets_[0])
    optimizer = unwrap_haste_optimizer(trainer.create_optimizer())
    assert isinstance(optimizer.encoder_optimizer, torch.optim.AdamW)
    assert isinstance(optimizer.output_optimizer, StochasticRoundingSGD)
    model = trainer.model
    output_params = {id(p) for g in optimizer.output_optimizer.param_groups for p in g["params"]}
    assert output_params == {id(p) for m in (model.output_layer.head, model.output_layer.tail) for p in m.parameters()}
    encoder_params = {id(p) for g in optimizer.encoder_optimizer.param_groups for p in g["params"]}
    assert id(model.output_layer.tail_projection.weight) in encoder_params
    assert len(encoder_params) + len(output_params) == len(list(model.parameters()))
    group = optimizer.output_optimizer.param_groups[0]
    assert (group["lr"], group["momentum"], group["weight_decay"]) == (0.1, 0.9, 1e-4)
    # A replicated output layer rounds with the run's seed on every rank (a sharded one takes a seed per rank).
    assert optimizer.output_optimizer.seed == trainer.args.seed


def test_training_logs_both_rates_and_rewires(tmp_path, tokenizer, datasets_):
    trainer = make_trainer(tmp_path, tokenizer, datasets_[0], save_strategy="no")
    supports = trainer.model.output_layer.tail.supports.clone()
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "learning_rate" in entry]
    assert logs and all("output_learning_rate" in entry for entry in logs)
    assert any(entry["learning_rate"] != entry["output_learning_rate"] for entry in logs)
    # Rates used by steps 1 and 2: the encoder warms up over 2 steps, the output layer over 1, then decays.
    assert [entry["learning_rate"] for entry in logs[:2]] == pytest.approx([0.0, 1e-3 / 2])
    assert [entry["output_learning_rate"] for entry in logs[:2]] == pytest.approx([0.0, 0.1])
    rewirings = [entry for entry in trainer.state.log_history if "rewired_pairs" in entry]
    assert [entry["step"] for entry in rewirings] == [3]  # steps 3 and 6; 6 > 2/3 of 8
    assert rewirings[0]["rewired_pairs"] == int(trainer.model.output_layer.tail.supports.numel() * 0.25)
    assert "loss" in rewirings[0]  # logged with the step's other values, not on its own
    assert not torch.equal(trainer.model.output_layer.tail.supports, supports)


def snapshot(trainer):
    model = trainer.model
    optimizer = unwrap_haste_optimizer(trainer.optimizer)
    momentum = {
        name: optimizer.output_optimizer.state[param]["momentum_buffer"].clone()
        for name, param in (("head", model.output_layer.head.weight), ("tail", model.output_layer.tail.weight))
    }
    return {k: v.clone() for k, v in model.state_dict().items()}, momentum, trainer.lr_scheduler.get_last_lr()


@pytest.mark.parametrize("output_layer_dtype", [None, "bfloat16"])
def test_resume_reproduces_uninterrupted_run_bit_for_bit(tmp_path, tokenizer, datasets_, output_layer_dtype):
    """Accumulation 2, clipping, rewiring at step 3 and 6 (end 1.0): steps 5-8 replay exactly after resume."""
    common = dict(rewiring_end_fraction=1.0, output_layer_dtype=output_layer_dtype)
    full = make_trainer(tmp_path / "full", tokenizer, datasets_[0], **common)
    full.train()

    class StopAt4(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == 4

    interrupted = make_trainer(tmp_path / "resumed", tokenizer, datasets_[0], callbacks=[StopAt4()], **common)
    interrupted.train()
    assert interrupted.state.global_step == 4
    resumed = make_trainer(tmp_path / "resumed", tokenizer, datasets_[0], model=make_model(), **common)
    resumed.train(resume_from_checkpoint=str(tmp_path / "resumed" / "checkpoint-4"))
    assert [e["step"] for e in resumed.state.log_history if "rewired_pairs" in e] == [3, 6]

    full_state, full_momentum, full_lrs = snapshot(full)
    resumed_state, resumed_momentum, resumed_lrs = snapshot(resumed)
    for name, tensor in full_state.items():
        assert torch.equal(tensor, resumed_state[name]), name
    for name, buffer in full_momentum.items():
        assert torch.equal(buffer, resumed_momentum[name]), name
    assert full_lrs == resumed_lrs
    if output_layer_dtype:
        assert (
            resumed.model.output_layer.tail.weight.dtype == torch.bfloat16
            and resumed.model.output_layer.head.weight.dtype == torch.bfloat16
        )


def test_evaluation_ranks_labels_with_top_k(tmp_path, tokenizer, datasets_):
    trainer = make_trainer(
        tmp_path,
        tokenizer,
        datasets_[0],
        save_strategy="no",
        max_steps=60,
        gradient_accumulation_steps=1,
        learning_rate=3e-3,
        rewiring_interval=20,
    )
    frequencies = np.bincount([label for row in datasets_[0]["labels"] for label in row], minlength=LABELS)
    propensity = Propensity.from_frequencies(frequencies, len(datasets_[0]))
    trainer.compute_metrics = make_compute_metrics(ks=(1, 3), propensity=propensity)
    trainer.eval_dataset = datasets_[1]
    before = trainer.evaluate()
    trainer.train()
    after = trainer.evaluate()
    assert {"eval_loss", "eval_P@1", "eval_P@3", "eval_PSP@1", "eval_nDCG@3"} <= set(after)
    assert after["eval_loss"] < before["eval_loss"]
    assert after["eval_P@1"] > before["eval_P@1"]


def test_gradient_accumulation_matches_one_big_batch(tmp_path, tokenizer, datasets_):
    """`accepts_loss_kwargs = False`: two half batches give the gradient of one full batch."""
    states = []
    for batch, accumulation in ((8, 1), (4, 2)):
        trainer = make_trainer(
            tmp_path / str(batch),
            tokenizer,
            datasets_[0],
            max_steps=1,
            save_strategy="no",
            rewiring_interval=0,
            per_device_train_batch_size=batch,
            gradient_accumulation_steps=accumulation,
            warmup_steps=0,
            output_learning_rate=0.5,
            output_momentum=0.0,
            output_weight_decay=0.0,
            max_grad_norm=0.0,
        )
        for module in trainer.model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        trainer.train()
        states.append(trainer.model.output_layer.tail.weight.detach().clone())
    torch.testing.assert_close(states[0], states[1], rtol=1e-4, atol=1e-6)


def test_arguments_are_validated(tmp_path):
    with pytest.raises(ValueError, match="`rewiring_fraction`"):
        HasteTrainingArguments(output_dir=str(tmp_path), rewiring_fraction=0.0)
    with pytest.raises(ValueError, match="`output_layer_dtype`"):
        HasteTrainingArguments(output_dir=str(tmp_path), output_layer_dtype="int8")
    with pytest.raises(ValueError, match="`output_learning_rate`"):
        HasteTrainingArguments(output_dir=str(tmp_path), output_learning_rate=-1.0)
    for max_steps in (0, -2):
        with pytest.raises(ValueError, match=f"`max_steps` must be >= 1, or -1 to train .* got {max_steps}"):
            HasteTrainingArguments(output_dir=str(tmp_path), max_steps=max_steps)
    with pytest.raises(ValueError, match="HasteForExtremeClassification"):
        HasteTrainer(model=torch.nn.Linear(2, 2), args=HasteTrainingArguments(output_dir=str(tmp_path)))


def test_model_card_names_both_optimizers(tmp_path, tokenizer, datasets_):
    trainer = make_trainer(tmp_path, tokenizer, datasets_[0], save_strategy="no", max_steps=4)
    trainer.model_card_data = {"dataset_name": "planted", "grouping": "frequency"}
    trainer.train()
    trainer.create_model_card()
    card = (tmp_path / "README.md").read_text()
    assert "| Encoder + projections | AdamW | 0.001 | cosine |" in card
    assert "| Head + tail | SGD (stochastic rounding) | 0.1 | cosine |" in card
    assert "momentum 0.9 (float32), decoupled weight decay 0.0001" in card
    assert "every 3 steps" in card and "planted" in card and "frequency" in card
    assert "adamw_torch" not in card
    # transformers' `create_model_card` takes one tag or a list of them.
    for tags, expected in (("planted-tag", ["planted-tag"]), (["one-tag", "two-tag"], ["one-tag", "two-tag"])):
        trainer.create_model_card(tags=tags)
        card_tags = ModelCard.load(tmp_path / "README.md").data.tags
        assert card_tags[-len(expected) :] == expected and all(len(tag) > 1 for tag in card_tags)


@pytest.mark.parametrize("output_max_grad_norm", [0.0, 0.5])
def test_encoder_and_output_layer_are_clipped_apart(tmp_path, tokenizer, datasets_, output_max_grad_norm):
    trainer = make_trainer(
        tmp_path, tokenizer, datasets_[0], max_grad_norm=0.1, output_max_grad_norm=output_max_grad_norm
    )
    model = trainer.model
    input_ids = torch.randint(5, 100, (8, 6))
    model(input_ids, torch.ones_like(input_ids), labels=torch.randint(0, LABELS, (8, 2))).loss.backward()
    encoder_side, output_layer = (
        [p for n, p in model.named_parameters() if not n.startswith(("output_layer.head.", "output_layer.tail."))],
        [p for n, p in model.named_parameters() if n.startswith(("output_layer.head.", "output_layer.tail."))],
    )
    norm = lambda params: torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])).item()  # noqa: E731
    output_before, encoder_before = norm(output_layer), norm(encoder_side)
    assert output_before > 1.0 and encoder_before > 0.1
    reported = trainer._clip_grad_norm(model)
    assert float(reported) == pytest.approx(encoder_before, rel=1e-5)
    assert norm(encoder_side) == pytest.approx(0.1, rel=1e-4)
    expected_output = output_max_grad_norm or output_before
    assert norm(output_layer) == pytest.approx(expected_output, rel=1e-4)


def test_output_clipping_needs_trainer_clipping(tmp_path):
    with pytest.raises(ValueError, match="`output_max_grad_norm`"):
        HasteTrainingArguments(output_dir=str(tmp_path), max_grad_norm=0.0, output_max_grad_norm=1.0)


def test_rewiring_a_tail_whose_fan_in_is_its_input_width_is_refused_at_construction(tmp_path, tokenizer, datasets_):
    full_fan_in = make_model(tail_projection_dim=8, fan_in=8)
    with pytest.raises(ValueError, match=r"fan-in \(8\) equals its input width \(8\).*rewiring_interval=0"):
        make_trainer(tmp_path, tokenizer, datasets_[0], model=full_fan_in)
    make_trainer(tmp_path, tokenizer, datasets_[0], model=full_fan_in, rewiring_interval=0)  # no rewiring: fine


def test_training_arguments_reach_the_rewiring_callback(tmp_path, tokenizer, datasets_):
    from haste_hf.training.callbacks import RewiringCallback

    trainer = make_trainer(
        tmp_path,
        tokenizer,
        datasets_[0],
        rewiring_interval=7,
        rewiring_fraction=0.3,
        rewiring_end_fraction=0.5,
        rewiring_scope="group",
        rewiring_init="random",
        rewiring_seed=9,
    )
    (callback,) = [c for c in trainer.callback_handler.callbacks if isinstance(c, RewiringCallback)]
    assert (callback.interval, callback.fraction, callback.end_fraction) == (7, 0.3, 0.5)
    assert (callback.scope, callback.init, callback.seed) == ("group", "random", 9)


def test_output_layer_schedule_follows_its_own_type_and_kwargs(tmp_path, tokenizer, datasets_):
    trainer = make_trainer(
        tmp_path,
        tokenizer,
        datasets_[0],
        max_steps=10,
        warmup_steps=0,
        output_warmup_steps=0,
        lr_scheduler_type="linear",
        output_lr_scheduler_type="cosine_with_min_lr",
        output_lr_scheduler_kwargs='{"min_lr_rate": 0.25}',
    )  # JSON text, as from the command line
    assert trainer.args.output_lr_scheduler_kwargs == {"min_lr_rate": 0.25}
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    encoder_schedule, output_schedule = trainer.lr_scheduler.schedulers
    rates = []
    for _ in range(10):
        rates.append((encoder_schedule.get_last_lr()[0], output_schedule.get_last_lr()[0]))
        trainer.optimizer.step()  # no gradients: changes nothing, but keeps the order schedulers expect
        trainer.lr_scheduler.step()
    rates.append((encoder_schedule.get_last_lr()[0], output_schedule.get_last_lr()[0]))
    assert rates[5][0] == pytest.approx(1e-3 * 0.5) and rates[10][0] == pytest.approx(0.0)  # linear
    # cosine down to min_lr_rate * lr: 0.1 * (0.25 + 0.75 * (1 + cos(pi t / T)) / 2)
    assert rates[5][1] == pytest.approx(0.1 * (0.25 + 0.75 * 0.5)) and rates[10][1] == pytest.approx(0.025)


def test_training_arguments_the_trainer_does_not_use_are_named_in_a_warning(tmp_path, tokenizer, datasets_):
    from transformers.testing_utils import CaptureLogger

    from haste_hf.training import trainer as trainer_module

    with CaptureLogger(trainer_module.logger) as captured:
        make_trainer(tmp_path, tokenizer, datasets_[0], optim="sgd", optim_args="a=1", label_smoothing_factor=0.1)
    assert "`optim=sgd` is ignored" in captured.out and "`optim_args` is ignored" in captured.out
    assert "`label_smoothing_factor` is ignored" in captured.out
    with CaptureLogger(trainer_module.logger) as captured:
        make_trainer(tmp_path, tokenizer, datasets_[0])
    assert captured.out == ""


def tokenized(dataset, tokenizer, max_length=16, keep_text=True):
    mapped = dataset.map(lambda rows: tokenizer(rows["text"], truncation=True, max_length=max_length), batched=True)
    return mapped if keep_text else mapped.remove_columns("text")


@pytest.mark.parametrize("keep_text", [True, False])
def test_pretokenized_dataset_trains_as_the_raw_text_does(tmp_path, tokenizer, datasets_, keep_text):
    common = dict(max_steps=4, save_strategy="no", rewiring_interval=2)
    raw = make_trainer(tmp_path / "raw", tokenizer, datasets_[0], **common)
    raw.train()
    # No data_collator: HasteTrainer batches the tokenizer's columns and the ragged label ids itself.
    pretokenized = HasteTrainer(
        model=make_model(),
        processing_class=tokenizer,
        train_dataset=tokenized(datasets_[0], tokenizer, keep_text=keep_text),
        args=HasteTrainingArguments(**{**raw.args.to_dict(), "output_dir": str(tmp_path / "tok")}),
    )
    assert isinstance(pretokenized.data_collator, XMCDataCollator)
    pretokenized.train()
    for name, tensor in raw.model.state_dict().items():
        assert torch.equal(tensor, pretokenized.model.state_dict()[name]), name


def test_collator_refuses_pretokenized_examples_longer_than_max_length(tokenizer, datasets_):
    rows = tokenized(datasets_[0].select(range(4)), tokenizer, max_length=64)
    with pytest.raises(
        ValueError, match=r"has \d+ tokens, more than the collator's max_length=4: tokenize with truncation"
    ):
        XMCDataCollator(tokenizer, max_length=4)(list(rows))
    batch = XMCDataCollator(tokenizer, max_length=64)(list(rows))
    assert batch["labels"].dtype == torch.long
    # The given token ids are used, not a tokenization of the text beside them.
    for row, ids in zip(rows, batch["input_ids"].tolist()):
        assert ids[: len(row["input_ids"])] == row["input_ids"] and set(ids[len(row["input_ids"]) :]) <= {
            tokenizer.pad_token_id
        }
    cut = tokenized(datasets_[0].select(range(4)), tokenizer, max_length=3)
    assert XMCDataCollator(tokenizer, max_length=64)(list(cut))["input_ids"].shape == (4, 3)


def test_haste_trainer_without_collator_or_tokenizer_is_refused(tmp_path):
    with pytest.raises(ValueError, match="needs a `data_collator`"):
        HasteTrainer(model=make_model(), args=HasteTrainingArguments(output_dir=str(tmp_path), report_to=[]))


def test_stock_trainer_trains_and_evaluates_from_top_k(tmp_path, tokenizer, datasets_):
    """A stock `transformers.Trainer` receives top-k label ids in evaluation, never `[N, L]` logits, and its
    metrics are HasteTrainer's."""
    from transformers import Trainer, TrainingArguments

    train, evaluation = (tokenized(split, tokenizer) for split in datasets_)
    stock = Trainer(
        model=make_model(),
        train_dataset=train,
        eval_dataset=evaluation,
        data_collator=XMCDataCollator(tokenizer),
        compute_metrics=make_compute_metrics(ks=(1, 3)),
        args=TrainingArguments(
            output_dir=str(tmp_path / "stock"),
            max_steps=4,
            per_device_train_batch_size=8,
            per_device_eval_batch_size=8,
            learning_rate=1e-2,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            save_strategy="no",
        ),
    )
    stock.train()
    predictions = stock.predict(evaluation)
    top_ids, top_scores = predictions.predictions
    assert top_ids.shape == top_scores.shape == (len(evaluation), stock.model.config.eval_top_k)
    assert np.all(np.diff(top_scores, axis=1) <= 0) and top_ids.max() < LABELS
    haste = make_trainer(tmp_path / "haste", tokenizer, datasets_[0], model=stock.model)
    haste.compute_metrics = make_compute_metrics(ks=(1, 3))
    quality = lambda metrics: {k: v for k, v in metrics.items() if "@" in k or k == "eval_loss"}  # noqa: E731
    stock_metrics, haste_metrics = quality(stock.evaluate()), quality(haste.evaluate(evaluation))
    assert {"eval_loss", "eval_P@1", "eval_nDCG@3"} <= set(stock_metrics)
    assert stock_metrics == pytest.approx(haste_metrics, rel=1e-6)


@pytest.mark.filterwarnings(r"ignore:Detected call of `lr_scheduler.step\(\)`")
def test_the_tail_learning_rate_scale_moves_the_tail_alone(tmp_path, tokenizer, datasets_):
    """`output_tail_lr_scale`: the tail's SGD steps (on the output layer's schedule) are that many times the head's;
    the head, and every parameter's place in the optimizer, stay as with one rate."""
    trainers = {
        scale: make_trainer(tmp_path / str(scale), tokenizer, datasets_[0], output_tail_lr_scale=scale)
        for scale in (1.0, 3.0)
    }
    steps = {}
    for scale, trainer in trainers.items():
        trainer.create_optimizer_and_scheduler(num_training_steps=8)
        output_optimizer = unwrap_haste_optimizer(trainer.optimizer).output_optimizer
        layer = trainer.model.output_layer
        assert [p for g in output_optimizer.param_groups for p in g["params"]] == layer.output_parameters()
        before = [p.detach().clone() for p in layer.output_parameters()]
        for index, param in enumerate(layer.output_parameters()):
            param.grad = torch.randn(param.shape, generator=torch.Generator().manual_seed(index))
        rates = []
        for _ in range(3):  # warm-up (1 step), then the cosine decay: the tail keeps its multiple of the head's rate
            trainer.lr_scheduler.step()
            rates.append([group["lr"] for group in output_optimizer.param_groups])
        output_optimizer.step()
        steps[scale] = {
            name: param.detach() - start
            for (name, param), start in zip(
                [
                    (n, p)
                    for n, p in layer.named_parameters()
                    if p.requires_grad and n.split(".")[0] in ("head", "tail")
                ],
                before,
            )
        }
        if scale == 1.0:
            assert len(output_optimizer.param_groups) == 1
        else:
            assert len(output_optimizer.param_groups) == 2 and rates[-1][0] > 0
            assert all(tail == pytest.approx(3 * head) for head, tail in rates)
            assert output_optimizer.param_groups[1]["params"] == list(layer.tail.parameters())
    assert steps[1.0].keys() == steps[3.0].keys() and any(name.startswith("tail") for name in steps[1.0])
    for name, step in steps[1.0].items():
        expected = 3 * step if name.startswith("tail") else step
        torch.testing.assert_close(steps[3.0][name], expected, msg=name)
    with pytest.raises(ValueError, match="output_tail_lr_scale"):
        HasteTrainingArguments(output_dir=str(tmp_path), use_cpu=True, output_tail_lr_scale=0)


def test_the_trainer_rewires_with_the_score_asked_for(tmp_path, tokenizer, datasets_):
    from haste_hf.training.callbacks import RewiringCallback

    for score in ("mean_abs", "label_normalized"):
        trainer = make_trainer(tmp_path / score, tokenizer, datasets_[0], rewiring_score=score)
        rewirings = [c for c in trainer.callback_handler.callbacks if isinstance(c, RewiringCallback)]
        assert [callback.score for callback in rewirings] == [score]
    with pytest.raises(ValueError, match="rewiring_score"):
        HasteTrainingArguments(output_dir=str(tmp_path), use_cpu=True, rewiring_score="max")


def test_one_process_orders_the_data_as_the_stock_trainer_does(tmp_path, tokenizer, datasets_):
    """On several processes the trainer sets `data_seed` (each rank's torch seed differs there); on one it leaves the
    arguments as given, and its data loader gives the examples in the stock Trainer's order, whatever the torch seed
    when the loader is made."""
    from transformers import Trainer, TrainingArguments

    haste = make_trainer(tmp_path / "haste", tokenizer, datasets_[0], save_strategy="no")
    assert haste.args.data_seed is None
    stock = Trainer(
        model=haste.model,
        args=TrainingArguments(
            output_dir=str(tmp_path / "stock"),
            per_device_train_batch_size=haste.args.per_device_train_batch_size,
            seed=haste.args.seed,
            remove_unused_columns=False,
            report_to=[],
            use_cpu=True,
        ),
        train_dataset=datasets_[0],
        data_collator=haste.data_collator,
    )

    def order(trainer, torch_seed):
        torch.manual_seed(torch_seed)
        return torch.cat([batch["input_ids"][:, :4].flatten() for batch in trainer.get_train_dataloader()])

    for torch_seed in (7, 8):
        assert torch.equal(order(haste, torch_seed), order(stock, torch_seed))


def test_the_memory_plan_is_sized_for_the_collators_length_else_the_encoders_else_512_tokens(tmp_path, monkeypatch):
    """The input length the memory plan is asked about: the collator's `max_length`, else the encoder's
    `max_position_embeddings`, else 512 (an encoder config that names no limit)."""
    from types import SimpleNamespace

    from haste_hf.training import memory_plan

    asked = []

    def plan_memory(args, model, *, tokens, sharded, device_memory):
        asked.append(tokens)
        return SimpleNamespace(
            output_momentum_dtype="float32",
            output_chunked_backward=False,
            output_fused_update=False,
            checkpoint_every=0,
        )

    monkeypatch.setattr(memory_plan, "plan_memory", plan_memory)
    args = HasteTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    model = make_model()
    HasteTrainer._plan_memory(args, model, False, SimpleNamespace(max_length=24))
    HasteTrainer._plan_memory(args, model, False, SimpleNamespace(max_length=None))
    no_limit = SimpleNamespace(config=SimpleNamespace(encoder=SimpleNamespace()))
    HasteTrainer._plan_memory(args, no_limit, False, None)
    assert asked == [24, model.config.encoder.max_position_embeddings, 512]


@pytest.mark.parametrize("chunked", [False, True])
def test_the_loss_backward_is_chunked_only_where_asked(tmp_path, tokenizer, datasets_, chunked):
    """With `output_chunked_backward` and `output_fused_update` off, the trainer's optimizer leaves the output layer's
    backward as the model's own; on, the head and tail weights run theirs by label chunks."""
    trainer = make_tiny_trainer(
        tmp_path,
        tokenizer,
        datasets_[0],
        model_fields=dict(label_count=LABELS),
        output_chunked_backward=chunked,
        output_fused_update=False,
        max_steps=1,
    )
    trainer.create_optimizer()
    layer = trainer.model.output_layer
    for weight in (layer.head.weight, layer.tail.weight):
        assert hasattr(weight, "_haste_chunked_backward") == chunked  # losses.chunk_loss_backward_'s mark


@pytest.mark.parametrize("error", [RuntimeError("bad header"), pickle.UnpicklingError("bad pickle"), EOFError()])
def test_a_checkpoint_file_that_does_not_load_is_named_with_its_checkpoint(error, tmp_path):
    """What the trainer's checkpoint loaders raise (`checkpoints._reading`): a file of a checkpoint that does not load
    is a `ValueError` naming the checkpoint and the file; outside a checkpoint, or for other errors, the loader's own
    error stands."""
    from haste_hf.training.checkpoints import _reading

    expected = str(error) or type(error).__name__
    message = f"^run/checkpoint-6: its optimizer.pt does not load \\({expected}\\); resume from an earlier checkpoint"
    with pytest.raises(ValueError, match=message), _reading("run/checkpoint-6", "optimizer.pt"):
        raise error
    with pytest.raises(type(error)), _reading(None, "optimizer.pt"):
        raise error
    with pytest.raises(FileNotFoundError), _reading("run/checkpoint-6", "weights"):
        torch.load(tmp_path / "missing.pt")


def test_the_ddp_kwargs_wrapper_renames_broadcast_buffers_and_passes_the_rest_of_the_handler_through():
    """`_ForwardSyncBuffersKwargs` (which `HasteTrainer` puts around accelerate's DDP kwargs handler on a torch that
    renamed `broadcast_buffers`): the DDP kwargs under the new name, and every other attribute the handler's own, as
    accelerate reads them (`comm_hook`, `register_comm_hook` when it wraps the model)."""
    from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs

    from haste_hf.training.trainer import _ForwardSyncBuffersKwargs

    handler = DistributedDataParallelKwargs(
        broadcast_buffers=False, find_unused_parameters=True, comm_hook=DDPCommunicationHookType.FP16
    )
    wrapped = _ForwardSyncBuffersKwargs(handler)
    assert wrapped.to_kwargs() == {"forward_sync_buffers": False, "find_unused_parameters": True}
    assert _ForwardSyncBuffersKwargs(DistributedDataParallelKwargs()).to_kwargs() == {}
    assert wrapped.comm_hook is DDPCommunicationHookType.FP16
    assert wrapped.register_comm_hook == handler.register_comm_hook


@pytest.mark.parametrize("takes_new_name", [True, False])
@pytest.mark.parametrize("has_handler", [True, False])
def test_the_accelerators_ddp_handler_is_wrapped_only_where_there_is_one_and_torch_renamed_the_kwarg(
    monkeypatch, takes_new_name, has_handler
):
    """`create_accelerator_and_postprocess` after the Trainer's own: a DDP kwargs handler (one-process runs have one
    too) is wrapped on a torch whose DDP takes `forward_sync_buffers`; no handler stays none; an older torch keeps
    the handler as it is."""
    from accelerate.utils import DistributedDataParallelKwargs
    from transformers import Trainer

    from haste_hf.training import trainer as trainer_module

    handler = DistributedDataParallelKwargs(broadcast_buffers=False) if has_handler else None
    monkeypatch.setattr(trainer_module, "DDP_TAKES_FORWARD_SYNC_BUFFERS", takes_new_name)
    monkeypatch.setattr(
        Trainer,
        "create_accelerator_and_postprocess",
        lambda self: setattr(self, "accelerator", types.SimpleNamespace(ddp_handler=handler)),
    )
    trainer = object.__new__(HasteTrainer)
    trainer.create_accelerator_and_postprocess()
    result = trainer.accelerator.ddp_handler
    if has_handler and takes_new_name:
        assert isinstance(result, trainer_module._ForwardSyncBuffersKwargs) and result.handler is handler
        assert result.to_kwargs() == {"forward_sync_buffers": False}
    else:
        assert result is handler


def test_a_trainers_ddp_handler_passes_broadcast_buffers_under_the_name_this_torchs_ddp_takes(tmp_path):
    from haste_hf.training import trainer as trainer_module

    args = HasteTrainingArguments(output_dir=str(tmp_path), ddp_broadcast_buffers=False, report_to="none")
    trainer = HasteTrainer(model=make_model(), args=args, data_collator=lambda examples: examples)
    kwargs = trainer.accelerator.ddp_handler.to_kwargs()
    name, old = "forward_sync_buffers", "broadcast_buffers"
    if not trainer_module.DDP_TAKES_FORWARD_SYNC_BUFFERS:
        name, old = old, name
    assert kwargs.get(name) is False and old not in kwargs


def test_stock_training_arguments_are_taken_with_hastes_defaults_for_the_rest_and_other_arguments_refused(tmp_path):
    from transformers import TrainingArguments
    from transformers.testing_utils import CaptureLogger

    from haste_hf.training import trainer as trainer_module

    stock = TrainingArguments(output_dir=str(tmp_path), learning_rate=3e-4, seed=11, report_to="none")
    with CaptureLogger(trainer_module.logger) as captured:
        args = trainer_module._as_haste_arguments(stock)
    assert isinstance(args, HasteTrainingArguments)
    assert (args.learning_rate, args.seed, args.output_dir) == (3e-4, 11, str(tmp_path))
    assert args.output_learning_rate == HasteTrainingArguments(output_dir=str(tmp_path)).output_learning_rate
    named = captured.out.split("own (")[1].split(")")[0].split(", ")
    assert "output_learning_rate" in named and "learning_rate" not in named and "seed" not in named
    with pytest.raises(ValueError, match="`args` must be TrainingArguments or HasteTrainingArguments, got dict"):
        trainer_module._as_haste_arguments({"output_dir": str(tmp_path)})


def test_a_checkpoint_is_read_row_by_row_where_the_run_or_the_checkpoint_is_sharded(tmp_path):
    from haste_hf.modeling.output_shards import OUTPUT_SHARDS_INDEX

    (tmp_path / "plain").mkdir()
    (tmp_path / "sharded").mkdir()
    (tmp_path / "sharded" / OUTPUT_SHARDS_INDEX).write_text("{}")
    whole, share = (
        types.SimpleNamespace(sharded_output_layer=None),
        types.SimpleNamespace(sharded_output_layer=object()),
    )
    reads = HasteTrainer._reads_rows_itself
    assert [reads(whole, None), reads(whole, str(tmp_path / "plain")), reads(whole, str(tmp_path / "sharded"))] == [
        False,
        False,
        True,
    ]
    assert [reads(share, None), reads(share, str(tmp_path / "plain"))] == [False, True]
