# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Label embeddings of millions of labels (issue 28): one `[L, d]` buffer on the device, and the encoder under
bf16 autocast on GPUs."""

import pytest
import torch
import torch.nn.functional as F
from tiny_encoders import WORDS

from haste_hf.labels.embeddings import compute_label_embeddings


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@needs_cuda
def test_label_embeddings_hold_one_label_by_dimension_buffer():
    """At 2M labels the accumulator is 256 MiB; normalising it out of place would hold two."""
    label_count, dim = 2_000_000, 32
    embed = lambda texts: torch.randn(len(texts), dim, device="cuda")  # noqa: E731
    texts = [str(i) for i in range(512)]
    labels = [[i * 3_900 + j for j in range(3)] for i in range(512)]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    embeddings = compute_label_embeddings(
        embed, texts, labels, label_count, batch_size=128, device="cuda", show_progress=False
    )
    buffer = label_count * dim * 4
    assert embeddings.shape == (label_count, dim)
    assert torch.cuda.max_memory_allocated() - before < 1.25 * buffer
    norms = embeddings.norm(dim=1)
    assert torch.allclose(norms[embeddings.abs().sum(1) > 0], torch.ones(1, device="cuda"), atol=1e-5)
    assert (norms == 0).sum() == label_count - 512 * 3  # labels without positives stay zero


@pytest.mark.gpu
@needs_cuda
def test_label_embeddings_run_the_encoder_in_bf16_on_gpus(tiny_bert):
    if not torch.cuda.is_bf16_supported():
        pytest.skip("needs a GPU with bf16")
    model, tokenizer = tiny_bert
    model = model.cuda()
    seen = []
    hook = model.encoder.layer[0].attention.self.query.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    texts = [" ".join(WORDS[i : i + 5]) for i in range(40)]
    labels = [[i % 7] for i in range(40)]
    try:
        embeddings = compute_label_embeddings(
            model, texts, labels, 7, tokenizer=tokenizer, batch_size=8, device="cuda", show_progress=False
        )
    finally:
        hook.remove()
    assert seen and set(seen) == {torch.bfloat16}
    assert embeddings.dtype == torch.float32
    reference = compute_label_embeddings(
        model.cpu(), texts, labels, 7, tokenizer=tokenizer, batch_size=8, device="cpu", show_progress=False
    )
    assert F.cosine_similarity(embeddings.cpu(), reference, dim=1).min() > 0.99


def test_label_embeddings_read_the_split_in_batches(monkeypatch):
    """Iterating `dataset["text"]` builds one row at a time (tens of seconds over millions of points): the layout
    reads the split's columns in Arrow batches, with the same embeddings."""
    import datasets

    from haste_hf.labels.layout import LabelLayout

    split = datasets.Dataset.from_dict(
        {"text": [f"text {i}" for i in range(300)], "labels": [[i % 40, (i * 7) % 40] for i in range(300)]}
    )
    column_type = type(split["text"])
    if column_type is list:
        pytest.skip("this datasets version returns columns as lists")
    embed = lambda texts: torch.stack([torch.randn(8, generator=torch.Generator().manual_seed(len(t))) for t in texts])  # noqa: E731
    expected = compute_label_embeddings(embed, list(split["text"]), list(split["labels"]), 40, show_progress=False)

    def refuse(self):
        raise AssertionError("a column iterated row by row")

    monkeypatch.setattr(column_type, "__iter__", refuse)
    layout = LabelLayout.from_training_split(
        split, 40, 4, head_label_count=4, encoder=embed, device="cpu", show_progress=False, seed=0
    )
    reference = LabelLayout.from_frequencies(
        layout.label_frequencies, 4, head_label_count=4, label_embeddings=expected, device="cpu", show_progress=False
    )
    assert torch.equal(layout.tail_order, reference.tail_order)
