import json

import pytest
from tiny_encoders import tiny_encoder_config

from haste_hf import HASTE_FORMAT_VERSION, HasteConfig


def make_config(**overrides):
    fields = dict(encoder=tiny_encoder_config("bert"), label_count=100, head_label_count=5, group_size=4, fan_in=8)
    fields.update(overrides)
    return HasteConfig(**fields)


def test_derived_sizes():
    config = make_config(label_count=103, head_label_count=3, group_size=8, tail_projection_dim=16)
    assert config.tail_label_count == 100
    assert config.tail_group_count == 13  # the last group holds 4 labels and 4 padding slots
    assert config.tail_input_dim == 16
    assert config.head_input_dim == 32


def test_round_trip_keeps_encoder_as_sub_config(tmp_path):
    config = make_config(pooling="cls", loss_reduction="mean", tail_bias=True)
    config.save_pretrained(tmp_path)
    loaded = HasteConfig.from_pretrained(tmp_path)
    assert type(loaded.encoder) is type(config.encoder)
    assert loaded.to_dict() == config.to_dict()
    assert loaded.get_text_config() is loaded.encoder


@pytest.mark.parametrize("family, pooling", [("bert", "mean"), ("mpnet", "mean"), ("qwen3", "last_token")])
def test_pooling_defaults_from_encoder_family(family, pooling):
    assert make_config(encoder=tiny_encoder_config(family)).pooling == pooling


def test_encoder_as_dict():
    config = make_config(encoder=tiny_encoder_config("roberta").to_dict())
    assert config.encoder.model_type == "roberta"
    with pytest.raises(ValueError, match="model_type"):
        make_config(encoder={"hidden_size": 32})


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"fan_in": 33}, "fan_in"),
        ({"fan_in": 17, "tail_projection_dim": 16}, "fan_in"),
        ({"fan_in": 0}, "fan_in"),
        ({"group_size": 0}, "group_size"),
        ({"group_size": 2.5}, "group_size"),
        ({"label_count": 0}, "label_count"),
        ({"head_label_count": 101}, "head_label_count"),
        ({"head_label_count": -1}, "head_label_count"),
        ({"pooling": "max"}, "pooling"),
        ({"loss_reduction": "none"}, "loss_reduction"),
        ({"classifier_dropout": 1.0}, "classifier_dropout"),
        ({"head_projection_dim": 0}, "head_projection_dim"),
        ({"tail_projection_dim": -4}, "tail_projection_dim"),
        ({"format_version": HASTE_FORMAT_VERSION + 1}, "format_version"),
    ],
)
def test_invalid_fields_name_the_field(overrides, field):
    with pytest.raises(ValueError, match=f"`{field}`"):
        make_config(**overrides)


def test_all_dense_model_ignores_fan_in():
    # No tail, so a fan-in wider than the features is irrelevant.
    assert make_config(head_label_count=100, fan_in=1000).tail_group_count == 0


def test_newer_checkpoint_is_refused_with_upgrade_hint(tmp_path):
    config = make_config()
    config.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(path.read_text().replace('"format_version": 3', '"format_version": 999'))
    with pytest.raises(ValueError, match="upgrade haste_hf"):
        HasteConfig.from_pretrained(tmp_path)


@pytest.mark.parametrize("normalize, written", [(False, 3), (True, 3)])
def test_checkpoints_are_written_in_the_oldest_format_that_holds_them(normalize, written, tmp_path):
    # Format 3 names the weights under `output_layer.`, which installs reading formats 1 and 2 would not find:
    # they must refuse every checkpoint written now.
    make_config(normalize=normalize).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["format_version"] == written
    assert HasteConfig.from_pretrained(tmp_path).normalize is normalize
    assert written <= HASTE_FORMAT_VERSION


def test_saved_config_describes_the_labels(tmp_path):
    """`num_labels`, `problem_type` and the names in `id2label` / `label2id`, as transformers' classifiers write them;
    `label_names.json` keeps the full list; past `MAX_CONFIG_LABEL_NAMES` the names stay out of config.json."""
    import json

    from haste_hf import HasteForExtremeClassification
    from haste_hf.modeling.configuration_haste import MAX_CONFIG_LABEL_NAMES

    config = HasteConfig(encoder=tiny_encoder_config("bert"), label_count=6, head_label_count=2, group_size=2, fan_in=4)
    model = HasteForExtremeClassification(config)
    model.set_label_names([f"tag {i}" for i in range(6)])
    model.save_pretrained(tmp_path / "small")
    saved = json.loads((tmp_path / "small" / "config.json").read_text())
    assert saved["problem_type"] == "multi_label_classification"
    assert saved["id2label"] == {str(i): f"tag {i}" for i in range(6)} and saved["label2id"]["tag 5"] == 5
    reloaded = HasteConfig.from_pretrained(tmp_path / "small")
    assert reloaded.num_labels == 6 and reloaded.id2label[3] == "tag 3"
    assert json.loads((tmp_path / "small" / "label_names.json").read_text()) == [f"tag {i}" for i in range(6)]

    big = HasteConfig(
        encoder=tiny_encoder_config("bert"), label_count=MAX_CONFIG_LABEL_NAMES + 1, group_size=2, fan_in=4
    )
    assert big.num_labels == MAX_CONFIG_LABEL_NAMES + 1 and big.id2label[7] == "LABEL_7" and big.label_names is None
    assert "id2label" not in big.to_dict() and "label2id" not in big.to_dict()
    assert big.to_dict()["problem_type"] == "multi_label_classification"


def test_a_folder_saved_before_the_label_fields_loads(tmp_path):
    import json

    from haste_hf import HasteForExtremeClassification

    config = HasteConfig(encoder=tiny_encoder_config("bert"), label_count=6, head_label_count=2, group_size=2, fan_in=4)
    model = HasteForExtremeClassification(config)
    model.set_label_names([f"tag {i}" for i in range(6)])
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    # What earlier versions wrote: transformers' two made-up labels and no problem type.
    saved.update(id2label={"0": "LABEL_0", "1": "LABEL_1"}, label2id={"LABEL_0": 0, "LABEL_1": 1})
    del saved["problem_type"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    reloaded = HasteForExtremeClassification.from_pretrained(tmp_path)
    assert reloaded.config.num_labels == 6 and reloaded.config.problem_type == "multi_label_classification"
    assert reloaded.config.id2label == {i: f"tag {i}" for i in range(6)} and reloaded.label_names[5] == "tag 5"


def test_num_labels_other_than_the_label_count_is_refused():
    with pytest.raises(ValueError, match="`num_labels` \\(3\\) differs from `label_count` \\(6\\)"):
        HasteConfig(encoder=tiny_encoder_config("bert"), label_count=6, num_labels=3, group_size=2, fan_in=4)
    with pytest.raises(ValueError, match="problem_type"):
        HasteConfig(
            encoder=tiny_encoder_config("bert"), label_count=6, problem_type="single_label_classification", fan_in=4
        )


def test_setting_num_labels_takes_the_label_count_and_refuses_another():
    """`config.num_labels = n` (as transformers' code writes it) is the label count or a refusal naming the field to
    set; the count is left as it was."""
    config = make_config(label_count=6, head_label_count=2, group_size=2, fan_in=4)
    config.num_labels = 6
    assert config.num_labels == config.label_count == 6
    with pytest.raises(
        ValueError, match="`num_labels` of a HASTE model is its `label_count` \\(6\\); set `label_count`"
    ):
        config.num_labels = 7
    assert config.num_labels == config.label_count == 6


@pytest.mark.parametrize("names", [None, ["zero", "one", "two"]])
def test_label_names_past_the_config_limit_answer_integer_ids_in_range_only(names):
    """`id2label` of a model past `MAX_CONFIG_LABEL_NAMES`: a Mapping of label id to name, whose lookups of anything
    but an integer id in range (a bool, a float, a string) are a KeyError, as a dict's."""
    from haste_hf.modeling.configuration_haste import LabelNames

    id2label = LabelNames(3, names)
    assert [id2label[label_id] for label_id in range(3)] == (names or ["LABEL_0", "LABEL_1", "LABEL_2"])
    assert len(id2label) == 3 and list(id2label) == [0, 1, 2]
    for key in (True, 1.0, "1", -1, 3):
        assert key not in id2label and id2label.get(key) is None
        with pytest.raises(KeyError):
            id2label[key]


@pytest.mark.parametrize("names", [None, ["zero", "one", "two"]])
def test_label_ids_past_the_config_limit_answer_each_name_its_id(names):
    """`label2id` beside a `LabelNames`: the id of each name (`LABEL_{id}` without names), a KeyError for any other
    key; both say in their repr how many labels they hold and whether they are named."""
    from haste_hf.modeling.configuration_haste import LabelIds, LabelNames

    id2label = LabelNames(3, names)
    label2id = LabelIds(id2label)
    expected = names or ["LABEL_0", "LABEL_1", "LABEL_2"]
    assert [label2id[name] for name in expected] == [0, 1, 2]
    assert len(label2id) == 3 and list(label2id) == expected and dict(label2id.items()) == dict(zip(expected, range(3)))
    with pytest.raises(KeyError):
        label2id["three"]
    named = ", named" if names else ""
    assert repr(id2label) == f"LabelNames(3 labels{named})"
    assert repr(label2id) == f"LabelIds(LabelNames(3 labels{named}))"


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"format_version": 0}, r"`format_version` must be an integer in \[1, \d+\], got 0: config.json is damaged"),
        ({"format_version": True}, r"`format_version` must be an integer in \[1, \d+\], got True"),
        ({"format_version": "3"}, r"`format_version` must be an integer in \[1, \d+\], got '3'"),
        ({"eval_top_k": 0}, r"`eval_top_k` must be a positive integer, got 0\."),
        ({"fan_in": True}, r"`fan_in` must be a positive integer, got True\."),
        ({"head_projection_dim": 2.0}, r"`head_projection_dim` must be a positive integer or None, got 2\.0\."),
        ({"head_label_count": True}, r"`head_label_count` must be an integer, got True\."),
        ({"head_label_count": 1.5}, r"`head_label_count` must be an integer, got 1\.5\."),
        ({"head_label_count": 101}, r"`head_label_count` \(101\) must lie in \[0, label_count=100\]"),
        ({"fan_in": 33}, r"`fan_in` \(33\) exceeds the tail's input size \(32\)"),
        ({"loss": "mse"}, r"`loss` must be one of"),
        ({"classifier_dropout": -0.1}, r"`classifier_dropout` must lie in \[0, 1\), got -0\.1\."),
    ],
)
def test_each_invalid_field_gets_its_own_message(overrides, message):
    with pytest.raises(ValueError, match="^" + message):
        make_config(**overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        {"format_version": 1},
        {"format_version": HASTE_FORMAT_VERSION},
        {"group_size": 1, "fan_in": 1, "eval_top_k": 1, "label_count": 1, "head_label_count": 0},
        {"head_label_count": 0},
        {"head_label_count": 100},
        {"fan_in": 32},
        {"fan_in": 16, "tail_projection_dim": 16, "head_projection_dim": 1},
        {"classifier_dropout": 0.0},
        {"classifier_dropout": 0.99},
    ],
)
def test_fields_at_the_ends_of_their_ranges_are_valid(overrides):
    config = make_config(**overrides)
    assert all(getattr(config, name) == value for name, value in overrides.items())


def test_a_key_near_a_haste_field_is_refused_and_other_unknown_keys_pass():
    from haste_hf.modeling.configuration_haste import check_unknown_keys

    with pytest.raises(ValueError, match=r"^HasteConfig: `group_sise` is not a field; did you mean `group_size`\?"):
        check_unknown_keys(["label_count", "group_sise"])
    check_unknown_keys(["model_type", "_private", "qqqqzzzz", "num_labels", "fan_in"])  # kept with a warning at most


def test_a_config_of_another_model_type_is_refused():
    with pytest.raises(ValueError, match=r"^This checkpoint holds a 'bert' model, not a HASTE one"):
        HasteConfig.from_dict({"model_type": "bert", "label_count": 4})


def test_num_labels_at_loading_is_the_label_count_and_keeps_the_heads_share(tmp_path):
    make_config(label_count=100, head_label_count=10).save_pretrained(tmp_path)
    loaded = HasteConfig.from_pretrained(tmp_path, num_labels=40)
    assert loaded.label_count == loaded.num_labels == 40 and loaded.head_label_count == 4
    assert HasteConfig.from_pretrained(tmp_path, num_labels=40, label_count=40).label_count == 40
    with pytest.raises(ValueError, match=r"^`num_labels` \(40\) and `label_count` \(50\) differ"):
        HasteConfig.from_pretrained(tmp_path, num_labels=40, label_count=50)


def test_the_custom_pipeline_is_named_only_where_the_package_does_not_register_it(monkeypatch):
    from haste_hf.modeling.configuration_haste import TEXT_CLASSIFICATION_PIPELINE

    config = make_config()
    monkeypatch.setattr(HasteConfig, "pipeline_is_installed", True)
    assert config.custom_pipelines == {}
    monkeypatch.setattr(HasteConfig, "pipeline_is_installed", False)
    pipelines = config.custom_pipelines
    assert pipelines == TEXT_CLASSIFICATION_PIPELINE and pipelines is not TEXT_CLASSIFICATION_PIPELINE


def test_the_notice_of_code_downloaded_from_the_models_own_repository_is_dropped_once_its_files_are_here(tmp_path):
    """`_RepeatedCodeNotice`: transformers' notice of downloaded files is dropped where the repository is the one
    this module was loaded from and every file listed is beside it; anything else passes."""
    import logging

    from haste_hf.modeling.configuration_haste import _RepeatedCodeNotice

    folder = tmp_path / "user" / "my_2d_model" / "abc123"
    folder.mkdir(parents=True)
    (folder / "modeling_haste.py").write_text("")
    (folder / "output_layer.py").write_text("")
    notice = _RepeatedCodeNotice(str(folder), lambda name: name.replace("-", "_"))

    def passes(message):
        return notice.filter(logging.LogRecord("t", logging.WARNING, "", 0, message, None, None))

    files = "\n- modeling_haste.py\n- output_layer.py\n. Make sure to double-check they do not contain malicious code."
    assert not passes(_RepeatedCodeNotice.NOTICE + "user/my-2d-model:" + files)
    assert passes(_RepeatedCodeNotice.NOTICE + "user/other-model:" + files)  # another repository
    assert passes(_RepeatedCodeNotice.NOTICE + "user/my-2d-model:" + files.replace("output_layer", "checks"))
    assert passes(_RepeatedCodeNotice.NOTICE + "user/my-2d-model:\n. No file listed.")
    assert passes(_RepeatedCodeNotice.NOTICE + "user/my-2d-model without a colon and a new line")
    assert passes("Some other warning:\n- modeling_haste.py")
