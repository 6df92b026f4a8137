import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from tiny_encoders import FAMILIES, VOCAB_SIZE, tiny_encoder_config
from tiny_haste import make_tiny_model
from transformers import AutoConfig, AutoModel

import haste_hf
from haste_hf import HasteConfig, HasteForExtremeClassification
from haste_hf.hub import AUTO_MAP
from haste_hf.modeling.output_layer import default_output_labels, output_labels_from_frequencies
from haste_hf.modeling.saving import SAVE_GENERATION_FILE


LABELS = 50

# (head labels, group size, fan-in, head projection, tail projection): the output-layer variants.
VARIANTS = {
    "haste": (4, 4, 8, None, 16),
    "haste-no-head": (0, 4, 8, None, None),
    "fixed-fan-in": (4, 1, 8, None, None),
    "dense": (LABELS, 4, 8, None, None),
    "dense-bottleneck": (LABELS, 4, 8, 8, None),
    "haste-both-projections": (6, 8, 5, 12, 10),
}


def make_model(variant="haste", family="bert", seed=0, **overrides):
    """A tiny model of an output-layer variant (`VARIANTS`) over an encoder family, in eval mode."""
    head, group_size, fan_in, head_projection, tail_projection = VARIANTS[variant]
    fields = dict(
        label_count=LABELS,
        head_label_count=head,
        group_size=group_size,
        fan_in=fan_in,
        head_projection_dim=head_projection,
        tail_projection_dim=tail_projection,
    )
    return make_tiny_model(encoder=family, seed=seed, training=False, **{**fields, **overrides})


def random_batch(batch=4, length=9, seed=0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, VOCAB_SIZE, (batch, length), generator=generator)
    attention_mask = torch.ones(batch, length, dtype=torch.long)
    attention_mask[1, 5:] = 0
    labels = torch.full((batch, 3), -100)
    labels[:, 0] = torch.randint(0, LABELS, (batch,), generator=generator)
    labels[0, 1:] = torch.tensor([LABELS - 1, 7])
    labels[2, 1] = 3
    return input_ids, attention_mask, labels


def multi_hot(labels, label_count=LABELS):
    dense = torch.zeros(labels.shape[0], label_count)
    for row, ids in enumerate(labels):
        dense[row, ids[ids >= 0]] = 1.0
    return dense


def reference_loss(logits, dense_labels, reduction="sum"):
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, dense_labels, reduction="sum")
    return loss / (logits.shape[0] * (logits.shape[1] if reduction == "mean" else 1))


@pytest.mark.parametrize("variant", VARIANTS)
def test_variants_loss_is_bce_over_label_order_logits(variant):
    model = make_model(variant)
    input_ids, attention_mask, labels = random_batch()
    with torch.no_grad():
        logits = model(input_ids, attention_mask).logits
        loss = model(input_ids, attention_mask, labels=labels).loss
    assert logits.shape == (4, LABELS)
    torch.testing.assert_close(loss, reference_loss(logits, multi_hot(labels)))
    # The tail of a HASTE variant really is sparse: its dense equivalent has F non-zeros per label.
    if model.output_layer.tail is not None:
        assert model.output_layer.tail.weight.shape[-1] == model.config.fan_in


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_labels_as_ids_or_multi_hot_give_the_same_loss_and_gradients(reduction):
    model = make_model(loss_reduction=reduction)
    input_ids, attention_mask, labels = random_batch()
    labels[3, 1:] = labels[3, 0]  # a repeated id counts once, as in the multi-hot
    losses, grads = [], []
    for given in (labels, multi_hot(labels), multi_hot(labels).bool()):
        model.zero_grad()
        loss = model(input_ids, attention_mask, labels=given).loss
        loss.backward()
        losses.append(loss.detach())
        grads.append(model.output_layer.tail.weight.grad.clone())
    for loss, grad in zip(losses[1:], grads[1:]):
        torch.testing.assert_close(loss, losses[0])
        torch.testing.assert_close(grad, grads[0])
    with torch.no_grad():
        logits = model(input_ids, attention_mask).logits
    torch.testing.assert_close(losses[0], reference_loss(logits, multi_hot(labels), reduction))


def test_training_maps_targets_not_logits():
    model = make_model()
    model.output_layer.output_labels.copy_(
        output_labels_from_frequencies(model.config, torch.randint(0, 100, (LABELS,)))
    )
    input_ids, attention_mask, labels = random_batch()
    with torch.no_grad():
        logits = model(input_ids, attention_mask).logits
        loss = model(input_ids, attention_mask, labels=labels).loss
        positions = model.output_layer.position_logits(model.encode(input_ids, attention_mask)[0])
    torch.testing.assert_close(loss, reference_loss(logits, multi_hot(labels)))
    torch.testing.assert_close(logits[:, model.output_layer.output_labels[:LABELS]], positions[:, :LABELS])


def test_bad_labels_are_rejected():
    model = make_model()
    input_ids, attention_mask, labels = random_batch()
    labels[0, 0] = LABELS
    with pytest.raises(ValueError, match="outside"):
        model(input_ids, attention_mask, labels=labels)
    with pytest.raises(ValueError, match="columns"):
        model(input_ids, attention_mask, labels=torch.zeros(4, LABELS + 1))


@pytest.mark.parametrize("variant", ["haste", "dense", "haste-no-head", "fixed-fan-in"])
def test_predict_topk_matches_full_logits_in_small_chunks(variant, monkeypatch):
    from haste_hf.modeling import output_layer

    model = make_model(variant)
    model.output_layer.output_labels.copy_(output_labels_from_frequencies(model.config, torch.randperm(LABELS)))
    input_ids, attention_mask, _ = random_batch()
    logits = model(input_ids, attention_mask).logits
    monkeypatch.setattr(output_layer, "TOPK_CHUNK_ELEMENTS", 4 * 8)  # two groups at a time
    top = model.predict_topk(input_ids, attention_mask, k=7)
    expected = logits.topk(7)
    assert torch.equal(top.label_ids, expected.indices)
    torch.testing.assert_close(top.scores, expected.values)
    forward_top = model(input_ids, attention_mask, top_k=7)
    assert torch.equal(forward_top.top_label_ids, expected.indices)
    torch.testing.assert_close(forward_top.top_scores, expected.values)
    with pytest.raises(ValueError, match="`k`"):
        model.predict_topk(input_ids, attention_mask, k=LABELS + 1)


def test_a_model_whose_weights_hold_nan_refuses_to_rank():
    """`topk` puts NaN first: a NaN weight would rank a label best for every text. `predict_topk` and the forward's
    top-k refuse, in one line naming the cause."""
    model = make_model()
    with torch.no_grad():
        model.output_layer.head.weight[0, 0] = float("nan")
    input_ids, attention_mask, _ = random_batch()
    for rank in (
        lambda: model.predict_topk(input_ids, attention_mask, k=3),
        lambda: model(input_ids, attention_mask, top_k=3),
    ):
        with pytest.raises(ValueError, match="scores hold NaN .* the labels cannot be ranked"):
            rank()


def test_padding_slots_are_never_predicted():
    model = make_model(label_count=LABELS + 1, tail_bias=True)  # 47 tail labels: the last group has a padding slot
    layer = model.output_layer
    assert (layer.output_labels == -1).sum() == 1 and layer.output_labels[-1] == -1
    with torch.no_grad():
        layer.tail.weight.fill_(0.0)
        layer.tail.bias.fill_(0.0)
        layer.tail.bias[-1] = 100.0  # the padding slot scores highest, whatever the input
        layer.head.weight.fill_(0.0)
        layer.head.bias.fill_(-1.0)
    input_ids, attention_mask, _ = random_batch()
    assert torch.all(model(input_ids, attention_mask).logits < 100.0)
    assert torch.all(model.predict_topk(input_ids, attention_mask, k=1).label_ids >= 0)
    top = model.predict_topk(input_ids, attention_mask, k=LABELS + 1)
    assert torch.all(top.label_ids >= 0)
    assert torch.equal(top.label_ids.sort(dim=1).values, torch.arange(LABELS + 1).expand(4, -1))


def test_output_labels_from_frequencies_and_grouping():
    model = make_model()
    frequencies = torch.tensor([5, 9, 9, 1] + [0] * (LABELS - 4))
    output_labels = output_labels_from_frequencies(model.config, frequencies)
    assert output_labels[:4].tolist() == [1, 2, 0, 3]  # ties broken by id
    tail = output_labels[4:LABELS]
    grouping = tail.flip(0)
    assert torch.equal(output_labels_from_frequencies(model.config, frequencies, grouping)[4:LABELS], grouping)
    with pytest.raises(ValueError, match="label_grouping"):
        output_labels_from_frequencies(model.config, frequencies, grouping[1:])
    with pytest.raises(ValueError, match="label_frequencies"):
        output_labels_from_frequencies(model.config, frequencies[1:])


def config_fields(config):
    fields = config.to_dict()
    fields.pop("_name_or_path", None)
    fields["encoder"].pop("_name_or_path", None)
    fields["encoder"].pop("dtype", None)  # loading records the dtype it loaded in
    return fields


def assert_same_state(model, other):
    assert model.state_dict().keys() == other.state_dict().keys()
    for name, tensor in model.state_dict().items():
        loaded = other.state_dict()[name]
        assert tensor.dtype == loaded.dtype and torch.equal(tensor, loaded), name


@pytest.mark.parametrize("variant", VARIANTS)
def test_save_load_round_trip_is_bit_identical(variant, tmp_path):
    model = make_model(variant, tail_bias=True)
    model.output_layer.output_labels.copy_(output_labels_from_frequencies(model.config, torch.randperm(LABELS)))
    model.set_label_names([f"label {i} ✓" for i in range(LABELS)])
    model.save_pretrained(tmp_path)
    assert {"config.json", "model.safetensors", "label_names.json"} <= set(os.listdir(tmp_path))
    loaded = AutoModel.from_pretrained(tmp_path)
    assert type(loaded) is HasteForExtremeClassification
    assert_same_state(model, loaded)
    assert config_fields(loaded.config) == config_fields(model.config)
    assert loaded.label_names == model.label_names
    assert config_fields(AutoConfig.from_pretrained(tmp_path)) == config_fields(model.config)
    input_ids, attention_mask, _ = random_batch()
    torch.testing.assert_close(
        loaded(input_ids, attention_mask).logits, model(input_ids, attention_mask).logits, rtol=0, atol=0
    )


def test_low_precision_load_keeps_integer_buffers(tmp_path):
    make_model().save_pretrained(tmp_path)
    loaded = HasteForExtremeClassification.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert loaded.output_layer.tail.weight.dtype == torch.bfloat16
    assert (
        loaded.output_layer.tail.supports.dtype == torch.int32
        and loaded.output_layer.output_labels.dtype == torch.int64
    )
    input_ids, attention_mask, labels = random_batch()
    assert torch.isfinite(loaded(input_ids, attention_mask, labels=labels).loss)


@pytest.mark.parametrize("max_shard_size", [None, "20KB"])
def test_output_layer_loads_in_the_dtype_it_was_saved_in(max_shard_size, tmp_path):
    # A run with a bf16 output layer (`--bf16`) saves it beside a float32 encoder: it loads back in bf16, so that
    # evaluate and predict score with the kernels and the numbers of training, not a float32 copy of it.
    model = make_model(tail_bias=True)
    for branch in (model.output_layer.head, model.output_layer.tail):
        branch.to(torch.bfloat16)
    model.save_pretrained(tmp_path, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    loaded = HasteForExtremeClassification.from_pretrained(tmp_path)
    assert_same_state(model, loaded)
    assert next(loaded.encoder.parameters()).dtype == torch.float32
    input_ids, attention_mask, _ = random_batch()
    expected, got = (
        model.predict_topk(input_ids, attention_mask, k=5),
        loaded.predict_topk(input_ids, attention_mask, k=5),
    )
    assert torch.equal(got.label_ids, expected.label_ids) and torch.equal(got.scores, expected.scores)
    # A dtype the caller names is the dtype of every weight, as before.
    as_float = HasteForExtremeClassification.from_pretrained(tmp_path, dtype=torch.float32)
    assert {p.dtype for p in as_float.parameters()} == {torch.float32}


def test_failed_save_leaves_previous_checkpoint_intact(tmp_path, monkeypatch):
    model = make_model()
    model.save_pretrained(tmp_path)
    before = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}
    from transformers import modeling_utils

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(modeling_utils, "safe_save_file", fail)
    with torch.no_grad():
        model.output_layer.tail.weight.add_(1.0)
    with pytest.raises(OSError, match="disk full"):
        model.save_pretrained(tmp_path)
    assert {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)} == before
    # Nothing of the failed save is left: no marker, no staging folder (the generation file is the first save's).
    leftovers = [name for name in os.listdir(tmp_path) if name.startswith(".haste-") and name != SAVE_GENERATION_FILE]
    assert not leftovers


def test_sharded_save_replaces_single_file(tmp_path):
    model = make_model()
    model.save_pretrained(tmp_path)
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    files = os.listdir(tmp_path)
    assert "model.safetensors" not in files and "model.safetensors.index.json" in files
    assert_same_state(model, HasteForExtremeClassification.from_pretrained(tmp_path))


def test_init_weights_reproduces_init_and_fills_missing_buffers(tmp_path):
    model = make_model(seed=3)
    again = make_model(seed=3)
    assert torch.equal(model.output_layer.tail.supports, again.output_layer.tail.supports)
    identity = default_output_labels(model.config)
    assert identity.tolist() == list(range(LABELS)) + [-1, -1]  # 46 tail labels in groups of 4
    assert torch.equal(model.output_layer.output_labels, identity)
    # Re-running the initialisation on a module gives the values `__init__` produced.
    supports = model.output_layer.tail.supports.clone()
    model.output_layer.tail.supports.fill_(-7)
    model.output_layer.output_labels.fill_(-7)
    for module in (model.output_layer.tail, model.output_layer):
        module._is_hf_initialized = False
    model.output_layer.tail.supports._is_hf_initialized = model.output_layer.output_labels._is_hf_initialized = False
    model._init_weights(model.output_layer.tail)
    model._init_weights(model.output_layer)
    assert torch.equal(model.output_layer.tail.supports, supports)
    assert torch.equal(model.output_layer.output_labels, identity)
    rows = model.output_layer.tail.supports.long().sort(dim=1).values
    assert (
        torch.all(rows[:, 1:] != rows[:, :-1]) and rows.min() >= 0 and rows.max() < model.output_layer.tail.in_features
    )
    # A checkpoint without the buffers loads with them filled as `__init__` would fill them.
    from safetensors.torch import load_file, save_file

    model.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    del state["output_layer.tail.supports"], state["output_layer.output_labels"]
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    loaded = HasteForExtremeClassification.from_pretrained(tmp_path)
    assert torch.equal(loaded.output_layer.tail.supports, supports)
    assert torch.equal(loaded.output_layer.output_labels, identity)


def test_every_saved_folder_loads_with_remote_code_without_the_package(tmp_path):
    model = make_model("haste-both-projections", tail_bias=True)
    model.output_layer.output_labels.copy_(output_labels_from_frequencies(model.config, torch.randperm(LABELS)))
    model.save_pretrained(tmp_path / "model")
    exported = set(os.listdir(tmp_path / "model"))
    assert {"configuration_haste.py", "modeling_haste.py", "sparse_ops.py", "pipeline_haste.py"} <= exported
    auto_map = json.loads((tmp_path / "model" / "config.json").read_text())["auto_map"]
    assert auto_map == AUTO_MAP
    input_ids, attention_mask, labels = random_batch()
    torch.save({"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}, tmp_path / "batch.pt")
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["haste_hf"] = None  # as if the package were not installed
        try:
            import haste_hf
        except ImportError:
            pass
        else:
            raise SystemExit("haste_hf is still importable")
        import torch
        from transformers import AutoModel
        model = AutoModel.from_pretrained({str(tmp_path / "model")!r}, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        batch = torch.load({str(tmp_path / "batch.pt")!r})
        with torch.no_grad():
            out = model(batch["input_ids"], batch["attention_mask"], labels=batch["labels"], return_logits=True)
            top = model.predict_topk(batch["input_ids"], batch["attention_mask"], k=5)
        torch.save({{"logits": out.logits, "loss": out.loss, "top": top.label_ids}}, {str(tmp_path / "out.pt")!r})
        """
    )
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    remote = torch.load(tmp_path / "out.pt")
    with torch.no_grad():
        local = model(input_ids, attention_mask, labels=labels, return_logits=True)
    torch.testing.assert_close(remote["logits"], local.logits, rtol=0, atol=0)
    torch.testing.assert_close(remote["loss"], local.loss, rtol=0, atol=0)
    assert torch.equal(remote["top"], model.predict_topk(input_ids, attention_mask, k=5).label_ids)


@pytest.mark.parametrize("family", FAMILIES)
def test_encoder_families(family, tmp_path):
    model = make_model(family=family)
    input_ids, attention_mask, labels = random_batch()
    model.train()
    loss = model(input_ids, attention_mask, labels=labels).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert model.output_layer.tail.weight.grad.abs().sum() > 0 and model.output_layer.head.weight.grad.abs().sum() > 0
    encoder_grads = [p.grad for p in model.encoder.parameters() if p.grad is not None]
    assert encoder_grads and any(g.abs().sum() > 0 for g in encoder_grads)
    model.eval()
    model.save_pretrained(tmp_path)
    loaded = AutoModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids, attention_mask).logits, model(input_ids, attention_mask).logits)


def _padding_gap(model, pad_token_id):
    """Largest change of a text's logits when it is scored alone vs padded in a batch beside a longer one."""
    generator = torch.Generator().manual_seed(1)
    short = torch.randint(4, VOCAB_SIZE, (1, 5), generator=generator)
    long = torch.randint(4, VOCAB_SIZE, (1, 9), generator=generator)
    padded = torch.cat([torch.cat([short, torch.full((1, 4), pad_token_id)], dim=1), long])
    mask = torch.ones_like(padded)
    mask[0, 5:] = 0
    with torch.no_grad():
        alone = model(short, torch.ones_like(short)).logits[0]
        in_batch = model(padded, mask).logits[0]
    return (alone - in_batch).abs().max().item()


@pytest.mark.parametrize("family", FAMILIES)
def test_padding_is_never_attended_to_fresh_or_reloaded(family, tmp_path):
    # Every way of building a model must mask padding as the reloaded model does: otherwise training and
    # its reported metrics see other inputs than every saved model.
    config = tiny_encoder_config(family)
    pad_token_id = config.pad_token_id or 0
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(tmp_path / "encoder")
    built = {
        "config": make_model(family=family),
        "encoder path": HasteForExtremeClassification.from_encoder_pretrained(
            tmp_path / "encoder", LABELS, head_label_count=4, group_size=4, fan_in=8
        ),
        "encoder object": HasteForExtremeClassification.from_encoder_pretrained(
            AutoModel.from_pretrained(tmp_path / "encoder"), LABELS, head_label_count=4, group_size=4, fan_in=8
        ),
    }
    for how, model in built.items():
        model.eval()
        assert model.encoder.config._attn_implementation is not None, how
        assert _padding_gap(model, pad_token_id) < 1e-5, how
        model.save_pretrained(tmp_path / how)
        reloaded = HasteForExtremeClassification.from_pretrained(tmp_path / how).eval()
        assert _padding_gap(reloaded, pad_token_id) < 1e-5, f"{how}, reloaded"
        with torch.no_grad():
            input_ids, attention_mask, _ = random_batch()
            torch.testing.assert_close(
                reloaded(input_ids, attention_mask).logits, model(input_ids, attention_mask).logits
            )


def test_wrapper_attention_implementation_reaches_the_encoder():
    config = HasteConfig(encoder=tiny_encoder_config("bert"), label_count=LABELS, fan_in=8, attn_implementation="eager")
    assert config.encoder._attn_implementation == "eager"
    encoder_config = tiny_encoder_config("bert")
    encoder_config._attn_implementation = "sdpa"
    assert HasteConfig(encoder=encoder_config, label_count=LABELS, fan_in=8).encoder._attn_implementation == "sdpa"


def test_last_token_pooling_handles_left_and_right_padding():
    model = make_model(family="qwen3")
    input_ids = random_batch(length=6)[0][:1]
    right = torch.tensor([[1, 1, 1, 1, 0, 0]])
    pooled_right, outputs = model.encode(input_ids, right)
    torch.testing.assert_close(pooled_right[0], outputs[0][0, 3])
    left = torch.tensor([[0, 0, 1, 1, 1, 1]])
    pooled_left, outputs = model.encode(input_ids, left)
    torch.testing.assert_close(pooled_left[0], outputs[0][0, 5])


def test_from_encoder_pretrained(tmp_path):
    from transformers import BertModel

    encoder = BertModel(tiny_encoder_config("bert"))
    encoder.save_pretrained(tmp_path / "encoder")
    frequencies = torch.randint(0, 20, (LABELS,))
    names = [f"name {i}" for i in range(LABELS)]
    model = HasteForExtremeClassification.from_encoder_pretrained(
        tmp_path / "encoder",
        label_count=LABELS,
        label_frequencies=frequencies,
        label_names=names,
        head_label_fraction=0.1,
        group_size=4,
        fan_in=8,
    )
    assert model.config.head_label_count == 5
    assert model.encoder.pooler is None
    for name, tensor in encoder.state_dict().items():
        if not name.startswith("pooler"):
            assert torch.equal(model.encoder.state_dict()[name], tensor), name
    head = model.output_layer.output_labels[:5]
    assert frequencies[head].min() >= frequencies[model.output_layer.output_labels[5:LABELS]].max()
    model.save_pretrained(tmp_path / "haste")
    assert HasteForExtremeClassification.from_pretrained(tmp_path / "haste").label_names == names
    with pytest.raises(ValueError, match="not both"):
        HasteForExtremeClassification.from_encoder_pretrained(
            encoder, LABELS, head_label_count=1, head_label_fraction=0.1
        )
    # An encoder object with a pooler loses it, so the checkpoint holds exactly a fresh model's tensors.
    with_pooler = BertModel(tiny_encoder_config("bert"))
    before = {name: tensor.clone() for name, tensor in with_pooler.state_dict().items()}
    model = HasteForExtremeClassification.from_encoder_pretrained(with_pooler, LABELS, group_size=4, fan_in=8)
    assert model.encoder.pooler is None
    for name, tensor in model.encoder.state_dict().items():  # used as given, not re-initialised
        assert torch.equal(tensor, before[name]), name
    assert model.state_dict().keys() == HasteForExtremeClassification(model.config).state_dict().keys()
    with pytest.raises(ValueError, match="label_names"):
        HasteForExtremeClassification.from_encoder_pretrained(encoder, LABELS, label_names=names[1:], fan_in=8)


def test_loss_falls_on_planted_task():
    """Each label fires on one planted token: a tiny model must learn that, through BCE alone."""
    torch.manual_seed(0)
    model = make_model("haste", fan_in=16).train()
    generator = torch.Generator().manual_seed(1)

    def planted_batch(labels):
        input_ids = torch.randint(60, VOCAB_SIZE, (labels.shape[0], 4), generator=generator)
        input_ids[:, 1] = labels[:, 0] + 4
        return input_ids, torch.ones_like(input_ids)

    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(400):
        labels = torch.randint(0, LABELS, (32, 1), generator=generator)
        loss = model(*planted_batch(labels), labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    # After the first steps every model predicts the label marginals (loss ~ ln(L) + 1 ~ 4.9);
    # only learning the planted token goes far below that.
    assert sum(losses[-20:]) / 20 < 2.0
    model.eval()
    labels = torch.arange(LABELS).unsqueeze(1)
    top1 = model.predict_topk(*planted_batch(labels), k=1).label_ids
    assert (top1 == labels).float().mean() > 0.8


def test_integer_multi_hot_labels_are_a_multi_hot_not_padded_ids():
    """`MultiLabelBinarizer` and many datasets give an int64 0/1 matrix `[B, L]`."""
    model = make_model()
    input_ids, attention_mask, labels = random_batch()
    dense = multi_hot(labels)
    with torch.no_grad():
        expected = model(input_ids, attention_mask, labels=dense).loss
        from_integers = model(input_ids, attention_mask, labels=dense.long()).loss
    torch.testing.assert_close(from_integers, expected)


def test_integer_zero_one_labels_over_two_labels_are_ambiguous():
    model = make_model(label_count=2, head_label_count=1, group_size=1, fan_in=4)
    input_ids, attention_mask, _ = random_batch()
    with pytest.raises(ValueError, match="multi-hot as bool or float, or pad label ids with -100"):
        model(input_ids, attention_mask, labels=torch.tensor([[0, 1]] * 4))
    model(input_ids, attention_mask, labels=torch.tensor([[0, -100]] * 4))  # padded ids: unambiguous


def test_a_grouping_made_for_another_group_size_is_refused():
    from transformers import BertModel

    from haste_hf.labels.grouping import group_labels

    frequencies = torch.arange(LABELS, 0, -1)
    grouping = group_labels(
        None, torch.arange(4, LABELS), group_size=8, strategy="frequency", label_frequencies=frequencies
    )
    encoder = BertModel(tiny_encoder_config("bert"), add_pooling_layer=False)
    with pytest.raises(ValueError, match=r"groups of 8 labels, but the model's `group_size` is 4"):
        HasteForExtremeClassification.from_encoder_pretrained(
            encoder,
            LABELS,
            label_frequencies=frequencies,
            label_grouping=grouping,
            head_label_count=4,
            group_size=4,
            fan_in=8,
        )


def test_the_model_api_defaults_to_the_papers_head():
    from transformers import BertModel

    encoder = BertModel(tiny_encoder_config("bert"), add_pooling_layer=False)
    model = HasteForExtremeClassification.from_encoder_pretrained(encoder, 200, group_size=4, fan_in=8)
    assert model.config.head_label_count == 6  # 3% of 200, as the CLI (test_cli) and LabelLayout (labels/test_layout)
    assert HasteConfig(encoder=tiny_encoder_config("bert"), label_count=200, fan_in=8).head_label_count == 6
    assert haste_hf.DEFAULT_HEAD_LABEL_FRACTION == 0.03


def test_encoder_kwargs_beside_an_encoder_model_are_named_in_a_warning():
    from transformers import BertModel
    from transformers.testing_utils import CaptureLogger

    from haste_hf.modeling import modeling_haste

    encoder = BertModel(tiny_encoder_config("bert"), add_pooling_layer=False)
    with CaptureLogger(modeling_haste.logger) as captured:
        HasteForExtremeClassification.from_encoder_pretrained(
            encoder, 20, encoder_kwargs={"revision": "v2"}, group_size=4, fan_in=8
        )
    assert "`encoder_kwargs` is ignored" in captured.out


def test_label_names_empty_ones_named_by_id_repeated_ones_kept_with_a_warning():
    from transformers.testing_utils import CaptureLogger

    from haste_hf.modeling import modeling_haste

    model = make_tiny_model(label_count=6, head_label_count=2)
    with CaptureLogger(modeling_haste.logger) as captured:
        model.set_label_names(["same", " ", "b", "same", "", "same"])
    assert model.label_names == ["same", "LABEL_1", "b", "same", "LABEL_4", "same"]
    assert model.config.id2label[4] == "LABEL_4" and model.config.label2id["same"] == 5
    assert (
        "2 empty name(s), named LABEL_<id> (e.g. label [1]); 2 repeated name(s) (e.g. [\"'same' for labels 0 and 3\"])"
        in (captured.out)
    )
    for names in ("abcdef", ["a"] * 5):
        with pytest.raises(
            ValueError, match=r"`label_names` has (a string|5 entries) for 6 labels: give a list of one"
        ):
            model.set_label_names(names)


def test_push_to_hub_without_the_hub_module_pushes_the_transformers_way(monkeypatch):
    """Exported code where `haste_hf` is not installed: `push_to_hub` is transformers' own, given the same arguments,
    and returns what it returns (the commit)."""
    model = make_tiny_model(label_count=LABELS)
    owner = next(cls for cls in type(model).__mro__[1:] if "push_to_hub" in vars(cls))
    calls = []

    def transformers_push(self, repo_id, **kwargs):
        calls.append((self, repo_id, kwargs))
        return "the commit"

    monkeypatch.setattr(owner, "push_to_hub", transformers_push)
    monkeypatch.setitem(sys.modules, "haste_hf.hub", None)  # as in exported code without the package
    assert model.push_to_hub("someone/model", private=True) == "the commit"
    assert calls == [(model, "someone/model", {"private": True})]


@pytest.mark.parametrize("family", ["bert", "mpnet"])  # checkpointing through transformers' code; through HASTE's
def test_is_gradient_checkpointing_says_whether_the_encoders_blocks_checkpoint(family):
    """The property peft reads (transformers deprecated its name): True once checkpointing is on, False off."""
    model = make_model(family=family)
    assert model.is_gradient_checkpointing is False
    model.gradient_checkpointing_enable()
    assert model.is_gradient_checkpointing is True
    model.gradient_checkpointing_disable()
    assert model.is_gradient_checkpointing is False
