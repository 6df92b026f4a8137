"""Tiny random encoder configs of every supported family, built offline for tests."""

from transformers import (
    BertConfig,
    DebertaV2Config,
    DistilBertConfig,
    ElectraConfig,
    ModernBertConfig,
    MPNetConfig,
    Qwen3Config,
    RobertaConfig,
    XLMRobertaConfig,
)


VOCAB_SIZE = 101
HIDDEN = 32


def tiny_encoder_config(family: str = "bert"):
    common = dict(vocab_size=VOCAB_SIZE, hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=2, intermediate_size=48)
    if family == "bert":
        return BertConfig(**common, max_position_embeddings=64)
    if family == "distilbert":
        return DistilBertConfig(vocab_size=VOCAB_SIZE, dim=HIDDEN, n_layers=1, n_heads=2, hidden_dim=48, max_position_embeddings=64)
    if family == "roberta":
        return RobertaConfig(**common, max_position_embeddings=72, pad_token_id=1)
    if family == "xlm-roberta":
        return XLMRobertaConfig(**common, max_position_embeddings=72, pad_token_id=1)
    if family == "electra":
        return ElectraConfig(**common, embedding_size=16, max_position_embeddings=64)
    if family == "modernbert":
        return ModernBertConfig(
            **common, max_position_embeddings=64, global_attn_every_n_layers=1, pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3
        )
    if family == "mpnet":
        return MPNetConfig(**common, max_position_embeddings=72, pad_token_id=1)
    if family == "deberta-v2":
        return DebertaV2Config(**common, max_position_embeddings=64, position_buckets=16, max_relative_positions=32)
    if family == "qwen3":
        return Qwen3Config(**common, num_key_value_heads=1, head_dim=16, max_position_embeddings=64, pad_token_id=0)
    raise KeyError(family)


FAMILIES = ("bert", "distilbert", "roberta", "xlm-roberta", "electra", "modernbert", "mpnet", "deberta-v2", "qwen3")
