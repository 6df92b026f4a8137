import math
from functools import partial

import pytest
import torch
from tiny_haste import make_tiny_model
from transformers import TrainerControl, TrainerState, TrainingArguments

from haste_hf.training.callbacks import RewiringCallback
from haste_hf.training.optimization import HasteOptimizer, StochasticRoundingSGD


def stepped(optimizer, weight):
    weight.grad = torch.randn_like(weight)
    optimizer.step()
    return optimizer


class _Wrapper(torch.nn.Module):  # stands in for DDP: the model under `.module`
    def __init__(self, module):
        super().__init__()
        self.module = module


tiny_haste_model = partial(make_tiny_model, label_count=30, head_label_count=3, fan_in=6, tail_projection_dim=16)


def test_callback_rewires_on_schedule_resets_momentum_and_logs():
    model = tiny_haste_model()  # 27 tail labels in 7 groups of 4: one padding slot
    tail = model.output_layer.tail
    output_optimizer = StochasticRoundingSGD(list(model.output_layer.tail.parameters()), lr=0.1, momentum=0.9)
    encoder_params = [p for name, p in model.named_parameters() if not name.startswith("output_layer.tail.")]
    optimizer = HasteOptimizer(torch.optim.AdamW(encoder_params), output_optimizer)
    stepped(optimizer, tail.weight)
    callback = RewiringCallback(interval=10, fraction=0.25, end_fraction=0.5)
    args = TrainingArguments(output_dir="unused", seed=5, report_to="none")
    state = TrainerState(max_steps=40)
    expected = []
    for global_step in range(1, 41):
        state.global_step = global_step
        before = tail.supports.clone()
        callback.on_step_end(args, state, TrainerControl(), model=_Wrapper(model), optimizer=optimizer)
        if global_step in (10, 20):
            changed = tail.supports != before
            assert int(changed.sum()) == math.floor(7 * 6 * 0.25)
            expected.append({"rewired_pairs": int(changed.sum()), "step": global_step})
            rewired = changed.unsqueeze(1).expand_as(tail.weight)
            assert bool((tail.weight[rewired] == 0).all())
            assert bool((output_optimizer.state[tail.weight]["momentum_buffer"][rewired] == 0).all())
        else:
            assert torch.equal(tail.supports, before)
    assert state.log_history == expected


def test_callback_is_a_pure_function_of_weights_seed_and_step():
    args = TrainingArguments(output_dir="unused", seed=5, report_to="none")
    results = []
    for _ in range(2):
        model = tiny_haste_model()
        state = TrainerState(max_steps=100, global_step=30)
        RewiringCallback(interval=30, fraction=0.3).on_step_end(args, state, TrainerControl(), model=model)
        results.append(model.output_layer.tail.supports.clone())
    assert torch.equal(results[0], results[1])
    assert not torch.equal(results[0], tiny_haste_model().output_layer.tail.supports)


def test_callback_rejects_bad_settings():
    with pytest.raises(ValueError, match="interval"):
        RewiringCallback(interval=0)
    with pytest.raises(ValueError, match="fraction"):
        RewiringCallback(fraction=0.0)
    with pytest.raises(ValueError, match="scope"):
        RewiringCallback(scope="label")


def train_with_trainer(output_dir, max_steps, resume_from_checkpoint=None, model_seed=0):
    """Plain transformers Trainer with the HASTE optimizer, schedules and rewiring callback."""
    from transformers import Trainer

    from haste_hf.training.optimization import get_haste_scheduler

    model = tiny_haste_model(seed=model_seed)
    model.output_layer.tail.to(
        torch.bfloat16
    )  # bf16 tail: exercises stochastic rounding and float32 momentum on resume
    output_params = list(model.output_layer.head.parameters()) + list(model.output_layer.tail.parameters())
    output_ids = {id(p) for p in output_params}
    optimizer = HasteOptimizer(
        torch.optim.AdamW([p for p in model.parameters() if id(p) not in output_ids], lr=1e-3),
        StochasticRoundingSGD(output_params, lr=0.5, momentum=0.9, weight_decay=1e-4, seed=3),
    )
    scheduler = get_haste_scheduler(optimizer, max_steps, encoder_warmup=2, output_warmup=0.25)
    generator = torch.Generator().manual_seed(0)
    dataset = [
        {
            "input_ids": torch.randint(4, 100, (6,), generator=generator),
            "labels": torch.randint(0, 30, (3,), generator=generator),
        }
        for _ in range(64)
    ]
    args = TrainingArguments(
        output_dir=str(output_dir),
        max_steps=max_steps,
        per_device_train_batch_size=4,
        save_steps=4,
        save_strategy="steps",
        logging_steps=1,
        report_to="none",
        seed=11,
        use_cpu=True,
        dataloader_num_workers=0,
        save_only_model=False,
    )
    callback = RewiringCallback(interval=2, fraction=0.3, end_fraction=0.75)
    trainer = Trainer(
        model=model, args=args, train_dataset=dataset, optimizers=(optimizer, scheduler), callbacks=[callback]
    )
    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    return model, trainer


def test_trainer_resume_reproduces_rewiring_and_optimizer_state(tmp_path):
    model, trainer = train_with_trainer(tmp_path / "full", max_steps=8)
    rewirings = [entry["step"] for entry in trainer.state.log_history if "rewired_pairs" in entry]
    assert rewirings == [2, 4, 6]
    # a differently initialised model: only the checkpoint can make it end where the full run ended
    checkpoint = str(tmp_path / "full" / "checkpoint-4")
    resumed, resumed_trainer = train_with_trainer(
        tmp_path / "resumed", max_steps=8, resume_from_checkpoint=checkpoint, model_seed=1
    )
    assert [e["step"] for e in resumed_trainer.state.log_history if "rewired_pairs" in e] == [2, 4, 6]
    assert not torch.equal(model.output_layer.tail.supports, tiny_haste_model().output_layer.tail.supports)
    for (name, ours), theirs in zip(model.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(ours, theirs), name


def rewired_supports(step, args_seed=5, callback_seed=None):
    model = tiny_haste_model()
    args = TrainingArguments(output_dir="unused", seed=args_seed, report_to="none")
    callback = RewiringCallback(interval=10, fraction=0.3, seed=callback_seed)
    callback.on_step_end(args, TrainerState(max_steps=100, global_step=step), TrainerControl(), model=model)
    return model.output_layer.tail.supports.clone()


def test_two_rewirings_of_a_run_draw_from_different_streams():
    """The callback hands the global step and the seed (its own, else the run's) to the rewiring."""
    at_10 = rewired_supports(10)
    assert torch.equal(at_10, rewired_supports(10))
    assert not torch.equal(at_10, rewired_supports(20))  # same weights, another step: other features
    assert not torch.equal(at_10, rewired_supports(10, args_seed=6))
    assert torch.equal(
        rewired_supports(10, args_seed=5, callback_seed=7), rewired_supports(10, args_seed=6, callback_seed=7)
    )


def test_callback_keeps_the_padding_slots_of_the_last_group_out_of_the_scores():
    model = tiny_haste_model()  # 27 tail labels in 7 groups of 4: label 3 of group 6 is padding
    assert model.output_layer.output_labels[-1] == -1 and (model.output_layer.output_labels[3:-1] >= 0).all()
    with torch.no_grad():
        model.output_layer.tail.weight.fill_(1.0)
        model.output_layer.tail.weight[6, :3, 0] = 0.01  # the weakest pair for the real labels of group 6 ...
        model.output_layer.tail.weight[6, 3, 0] = 100.0  # ... unless the padding label's weight counts
    before = model.output_layer.tail.supports.clone()
    args = TrainingArguments(output_dir="unused", seed=0, report_to="none")
    state = TrainerState(max_steps=100, global_step=10)
    RewiringCallback(interval=10, fraction=1 / 42).on_step_end(
        args, state, TrainerControl(), model=model
    )  # 1 of 42 pairs
    changed = (model.output_layer.tail.supports != before).nonzero().tolist()
    assert changed == [[6, 0]]


def test_random_regrowth_of_a_bfloat16_tail_stays_within_the_initial_bound():
    model = tiny_haste_model()
    model.output_layer.tail.to(torch.bfloat16)
    before = model.output_layer.tail.supports.clone()
    args = TrainingArguments(output_dir="unused", seed=0, report_to="none")
    state = TrainerState(max_steps=100, global_step=10)
    RewiringCallback(interval=10, fraction=0.5, init="random").on_step_end(args, state, TrainerControl(), model=model)
    regrown = (model.output_layer.tail.supports != before).unsqueeze(1).expand_as(model.output_layer.tail.weight)
    values = model.output_layer.tail.weight[regrown].float()
    fan_in = model.config.fan_in
    assert model.output_layer.tail.weight.dtype == torch.bfloat16 and values.numel() == 4 * math.floor(7 * 6 * 0.5)
    assert bool((values.abs() <= 1 / math.sqrt(fan_in)).all()) and bool((values != 0).all())
    assert values.std() > 0.5 / math.sqrt(3 * fan_in)  # spread over the bound (uniform std: bound / sqrt(3))


def test_callback_scores_pairs_as_asked():
    """`score="label_normalized"` reaches the tail's rewiring: the callback regrows exactly the pairs that
    `rewire_(..., score="label_normalized")` regrows, which differ here from the mean-|w| ones."""
    from haste_hf.modeling.rewiring import rewire_

    args = TrainingArguments(output_dir="unused", seed=5, report_to="none")
    state = TrainerState(max_steps=100, global_step=30)
    model = tiny_haste_model()
    with torch.no_grad():  # in every group, one label with weights 100 times the others'
        model.output_layer.tail.weight[:, 0] *= 100
    tail = model.output_layer.tail
    label_mask = (model.output_layer.output_labels[3:] >= 0).view(7, 4)
    expected = {}
    for score in ("mean_abs", "label_normalized"):
        supports = tail.supports.clone()
        rewire_(
            tail.weight.clone(), supports, tail.in_features, 0.3, seed=5, step=30, label_mask=label_mask, score=score
        )
        expected[score] = supports
    assert not torch.equal(expected["mean_abs"], expected["label_normalized"])
    RewiringCallback(interval=30, fraction=0.3, score="label_normalized").on_step_end(
        args, state, TrainerControl(), model=model
    )
    assert torch.equal(tail.supports, expected["label_normalized"])
    with pytest.raises(ValueError, match="score"):
        RewiringCallback(score="max")
