"""Every default of the recipe, pinned: a default is a product decision measured on real data
(`benchmarks/recipe_study.py`, `benchmarks/README.md`), so a refactor must not move one silently. Changing a value
here means measuring it through `haste-hf train` first."""

import pytest

from haste_hf.cli.parser import parse_args
from haste_hf.recipe import RecipeArguments, _training_arguments
from haste_hf.training.training_args import HasteTrainingArguments


# The recipe of `benchmarks/recipe_study.py`'s `defaults` rows (the device has bf16; here, without a GPU, it is off).
RECIPE = dict(
    learning_rate=2e-4,
    num_train_epochs=10.0,
    per_device_train_batch_size=128,
    per_device_eval_batch_size=64,
    warmup_steps=0.1,
    weight_decay=0.01,
    lr_scheduler_type="cosine",
    output_learning_rate=0.4,
    output_momentum=0.9,
    output_weight_decay=1e-4,
    output_lr_scheduler_type="cosine",
    output_warmup_steps=0.0,
    output_max_grad_norm=0.0,
    output_stochastic_rounding=True,
    # Not given: `HasteTrainer` chooses them (haste_hf.memory_plan; pinned below).
    output_momentum_dtype=None,
    output_chunked_backward=None,
    output_fused_update=None,
    rewiring_interval=None,
    rewiring_fraction=0.2,
    rewiring_end_fraction=2 / 3,
    rewiring_init="zero",
    rewiring_scope="global",
    rewiring_score="mean_abs",
    output_tail_lr_scale=2.0,  # DEFAULT_TAIL_LR_SCALE: the trainer's own default too, so the API trains as the CLI
    bf16=False,
    output_layer_dtype=None,
    max_grad_norm=1.0,
    seed=42,
    eval_top_k=5,
)
RECIPE_STRUCTURE = dict(
    fan_in=128,
    max_length=128,
    validation_fraction=0.0,
    group_size=None,
    head_label_fraction=None,
    grouping=None,
    label_texts=False,
    init_from_label_texts=True,
    label_text_init_scale=1.0,
    label_text_grouping_below=0,
    frequency_bands=None,
    tail_bias=True,
    head_projection_dim=None,
    tail_projection_dim=None,
)
# The demo keeps its own recipe (2 CPU cores, minutes), so the README's table stays what it prints.
DEMO = dict(
    learning_rate=1e-4,
    num_train_epochs=3,
    per_device_train_batch_size=32,
    warmup_steps=0.1,
    weight_decay=0.01,
    output_learning_rate=0.05,
    rewiring_interval=50,
    bf16=False,
)
DEMO_STRUCTURE = dict(fan_in=64, max_length=32, validation_fraction=0.1, encoder="minilm")


def fields_of(arguments, names):
    return {name: getattr(arguments, name) for name in names}


def test_training_arguments_defaults(tmp_path):
    assert fields_of(HasteTrainingArguments(output_dir=str(tmp_path), use_cpu=True), RECIPE) == RECIPE


def test_recipe_arguments_defaults():
    assert fields_of(RecipeArguments(), RECIPE_STRUCTURE) == RECIPE_STRUCTURE


def test_the_api_and_the_command_line_train_the_same_recipe(tmp_path):
    api, _ = _training_arguments({"use_cpu": True}, str(tmp_path), has_validation=False)
    args = parse_args(["train", "--use-cpu", "--output-dir", str(tmp_path)])
    expected = {**RECIPE, "seed": 0}  # the command line seeds 0, as every earlier version did
    assert fields_of(args.training, RECIPE) == expected
    assert fields_of(api, RECIPE) == RECIPE
    assert fields_of(args.recipe, RECIPE_STRUCTURE) == RECIPE_STRUCTURE


def test_demo_defaults():
    args = parse_args(["demo", "--use-cpu"])
    assert fields_of(args.training, DEMO) == DEMO
    assert fields_of(args.recipe, DEMO_STRUCTURE) == DEMO_STRUCTURE


@pytest.mark.parametrize(
    "argv, bf16, dtype",
    [
        (["--bf16"], True, "bfloat16"),
        (["--bf16", "false"], False, None),
        (["--bf16", "--output-layer-dtype", "float32"], True, "float32"),
    ],
)
def test_bf16_trains_the_output_layer_in_bf16_unless_told(argv, bf16, dtype):
    training = parse_args(["train", "--use-cpu", *argv]).training
    assert (training.bf16, training.output_layer_dtype) == (bf16, dtype)


def test_default_rewiring_spreads_six_rewirings_over_the_first_two_thirds():
    from haste_hf.training.callbacks import RewiringCallback

    callback = RewiringCallback()
    steps = [step for step in range(1, 3401) if callback.should_rewire(step, 3400)]
    assert steps == [377, 754, 1131, 1508, 1885, 2262]  # as the study's runs of 3,400 steps rewired


def test_model_defaults_are_the_recipes():
    """A model built without the recipe (`HasteConfig`, `from_encoder_pretrained`) gets the recipe's G and F."""
    import inspect

    from haste_hf import HasteConfig

    parameters = inspect.signature(HasteConfig.__init__).parameters
    assert (parameters["group_size"].default, parameters["fan_in"].default) == (16, 128)


def test_memory_options_choose_themselves(tmp_path):
    """Measured on an H100 at 8.6M labels (issue 28): the output-layer options on a GPU with a bf16 output layer
    (13.0 GiB against 18.7 at +1% step time, deps P@1 72.92 against 72.99), off elsewhere; encoder checkpointing
    only where the planned peak exceeds 85% of the GPU, the cheapest first (none, every 4th, 3rd, 2nd block, all)."""
    from tiny_haste import make_tiny_model

    from haste_hf.training import memory_plan

    args = HasteTrainingArguments(output_dir=str(tmp_path), use_cpu=True, output_layer_dtype="bfloat16")
    names = ("output_momentum_dtype", "output_chunked_backward", "output_fused_update", "checkpoint_every")

    def plan(device_memory):
        chosen = memory_plan.plan_memory(args, make_tiny_model(), tokens=16, sharded=False, device_memory=device_memory)
        return tuple(getattr(chosen, name) for name in names)

    assert plan(80 * 2**30) == ("bfloat16", True, True, 0)
    assert plan(None) == ("float32", False, False, 0)
    assert (memory_plan.DEVICE_MEMORY_SHARE, memory_plan.CHECKPOINT_CHOICES) == (0.85, (0, 4, 3, 2, 1))


def test_the_tail_defaults_have_off_switches():
    """The tail study's defaults (issue 39) come from one constant each, and each turns off from the command line
    (a checkpoint trained before them resumes only with them off)."""
    from haste_hf.modeling.defaults import DEFAULT_TAIL_LR_SCALE

    args = parse_args(["train", "--use-cpu"])
    assert args.training.output_tail_lr_scale == DEFAULT_TAIL_LR_SCALE
    assert HasteTrainingArguments.output_tail_lr_scale == DEFAULT_TAIL_LR_SCALE  # one constant: the trainer's too
    assert args.recipe.tail_bias and args.recipe.init_from_label_texts
    off = parse_args(["train", "--use-cpu", "--no-tail-bias", "--no-init-from-label-texts"]).recipe
    assert not off.tail_bias and not off.init_from_label_texts
    assert parse_args(["train", "--use-cpu", "--output-tail-lr-scale", "1"]).training.output_tail_lr_scale == 1.0
