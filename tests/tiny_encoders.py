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
    common = dict(
        vocab_size=VOCAB_SIZE, hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=2, intermediate_size=48
    )
    if family == "bert":
        return BertConfig(**common, max_position_embeddings=64)
    if family == "distilbert":
        return DistilBertConfig(
            vocab_size=VOCAB_SIZE, dim=HIDDEN, n_layers=1, n_heads=2, hidden_dim=48, max_position_embeddings=64
        )
    if family == "roberta":
        return RobertaConfig(**common, max_position_embeddings=72, pad_token_id=1)
    if family == "xlm-roberta":
        return XLMRobertaConfig(**common, max_position_embeddings=72, pad_token_id=1)
    if family == "electra":
        return ElectraConfig(**common, embedding_size=16, max_position_embeddings=64)
    if family == "modernbert":
        return ModernBertConfig(
            **common,
            max_position_embeddings=64,
            global_attn_every_n_layers=1,
            pad_token_id=0,
            bos_token_id=2,
            eos_token_id=3,
            cls_token_id=2,
            sep_token_id=3,
        )
    if family == "mpnet":
        return MPNetConfig(**common, max_position_embeddings=72, pad_token_id=1)
    if family == "deberta-v2":
        return DebertaV2Config(**common, max_position_embeddings=64, position_buckets=16, max_relative_positions=32)
    if family == "qwen3":
        return Qwen3Config(**common, num_key_value_heads=1, head_dim=16, max_position_embeddings=64, pad_token_id=0)
    raise KeyError(family)


FAMILIES = ("bert", "distilbert", "roberta", "xlm-roberta", "electra", "modernbert", "mpnet", "deberta-v2", "qwen3")


SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [f"w{i}" for i in range(VOCAB_SIZE - len(SPECIAL_TOKENS))]


def tiny_tokenizer(directory):
    """A WordPiece tokenizer over `SPECIAL_TOKENS + WORDS` (ids 0..VOCAB_SIZE-1), saved to `directory`."""
    from transformers import BertTokenizer

    tokenizer = BertTokenizer(vocab={token: i for i, token in enumerate(SPECIAL_TOKENS + WORDS)})
    tokenizer.save_pretrained(directory)
    return tokenizer


def planted_texts(label_count, size, seed=0, labels_per_text=2):
    """Texts whose labels are planted as words: label l appears as word `w{l}` among noise words."""
    import random

    rng = random.Random(seed)
    noise = WORDS[label_count:]
    rows = []
    for _ in range(size):
        labels = sorted(rng.sample(range(label_count), rng.randint(1, labels_per_text)))
        words = [WORDS[label] for label in labels] + rng.sample(noise, 4)
        rng.shuffle(words)
        rows.append({"text": " ".join(words), "labels": labels})
    return rows
