"""config.json names the labels up to exactly `MAX_CONFIG_LABEL_NAMES` = 10,000 (mutation testing changed the
comparison and the value unnoticed)."""

from tiny_encoders import tiny_encoder_config

from haste_hf import HasteConfig
from haste_hf.modeling.configuration_haste import MAX_CONFIG_LABEL_NAMES


def test_config_json_names_labels_up_to_exactly_10000():
    assert MAX_CONFIG_LABEL_NAMES == 10_000
    encoder = tiny_encoder_config("bert")
    at_limit = HasteConfig(encoder=encoder, label_count=10_000, head_label_count=10, fan_in=8)
    at_limit.set_label_names([f"tag {i}" for i in range(10_000)])
    assert at_limit.to_dict()["id2label"][9_999] == "tag 9999" and len(at_limit.label2id) == 10_000
    past = HasteConfig(encoder=encoder, label_count=10_001, head_label_count=10, fan_in=8)
    past.set_label_names([f"tag {i}" for i in range(10_001)])
    assert "id2label" not in past.to_dict() and "label2id" not in past.to_dict()


def test_a_config_of_exactly_10000_named_labels_keeps_its_names_when_built_and_reloaded():
    """The bound as the config reads `id2label` at construction (`_label_maps`), as `from_pretrained` builds it."""
    encoder = tiny_encoder_config("bert")
    names = {label_id: f"tag {label_id}" for label_id in range(10_000)}
    built = HasteConfig(encoder=encoder, label_count=10_000, head_label_count=10, fan_in=8, id2label=names)
    assert isinstance(built.id2label, dict) and built.label_names[9_999] == "tag 9999"
    reloaded = HasteConfig.from_dict(built.to_dict())
    assert reloaded.label_names == [names[label_id] for label_id in range(10_000)]
    assert reloaded.label2id["tag 0"] == 0 and reloaded.to_dict()["id2label"][9_999] == "tag 9999"
