"""What may name a model (haste_hf.modeling.model_sources.check_model_source): a model folder, or a Hub id;
paths that name no folder are reported missing instead of being looked up on the Hub."""

import pytest

from haste_hf.modeling.model_sources import check_model_source


def test_a_model_folder_or_a_hub_id_is_accepted(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    check_model_source(str(tmp_path))
    check_model_source("user/model", namespaced=True)
    check_model_source("bert-base-uncased")  # an old canonical encoder: no namespace


@pytest.mark.parametrize(
    "name, namespaced, message",
    [
        ("bert-base-uncased", True, "not a Hub id such as user/model"),  # a trained model's id has a namespace
        ("./out", False, "no folder './out'"),
        ("runs/a/b", False, "no folder 'runs/a/b'"),
    ],
)
def test_a_name_that_is_neither_is_refused(name, namespaced, message):
    with pytest.raises(ValueError, match=message):
        check_model_source(name, namespaced=namespaced)


def test_a_folder_without_a_config_or_a_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match="holds no config.json"):
        check_model_source(str(tmp_path))
    (tmp_path / "weights.bin").write_text("")
    with pytest.raises(ValueError, match="is a file"):
        check_model_source(str(tmp_path / "weights.bin"))
