"""A SentenceTransformer (object or folder) as the encoder of `from_encoder_pretrained`: the HASTE model pools as the
SentenceTransformer does and leaves out its Normalize, saying so once (as `haste-hf train` does); module chains
HASTE cannot reproduce are refused."""

import json

import pytest
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules.dense import Dense
from sentence_transformers.base.modules.normalize import Normalize
from sentence_transformers.base.modules.transformer import Transformer
from sentence_transformers.sentence_transformer.modules.pooling import Pooling
from tiny_encoders import HIDDEN, WORDS, tiny_encoder_config, tiny_tokenizer
from transformers import AutoModel, AutoTokenizer, BertModel
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from haste_hf import HasteForExtremeClassification


LABELS = 20
TEXTS = [" ".join(WORDS[i : i + 3 + i % 4]) for i in range(0, 40, 7)]
NOTICE = "ends in a Normalize module, left out: HASTE fine-tunes the encoder, and unit-norm features trained 4.2 PSP@5"


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bert")
    torch.manual_seed(0)
    BertModel(tiny_encoder_config("bert")).save_pretrained(folder)
    tiny_tokenizer(folder)
    return folder


def sentence_transformer(bert_dir, pooling_mode="mean", normalize=True, extra=()):
    transformer = Transformer(str(bert_dir), max_seq_length=32)
    modules = [transformer, Pooling(HIDDEN, pooling_mode=pooling_mode), *extra, *([Normalize()] if normalize else [])]
    return SentenceTransformer(modules=modules, device="cpu").eval()


def haste_embeddings(model, bert_dir):
    batch = AutoTokenizer.from_pretrained(bert_dir)(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model.eval().encode(batch["input_ids"], batch["attention_mask"])[0]


def build(encoder, **kwargs):
    return HasteForExtremeClassification.from_encoder_pretrained(
        encoder, LABELS, head_label_count=2, group_size=4, fan_in=8, **kwargs
    )


def build_and_notices(encoder, **kwargs):
    """The model, and the lines `from_encoder_pretrained` logged that name a left-out Normalize."""
    with CaptureLogger(logging.get_logger("transformers.haste_hf.modeling.sentence_transformer_encoder")) as captured:
        model = build(encoder, **kwargs)
    return model, [line for line in captured.out.splitlines() if "Normalize" in line]


@pytest.mark.parametrize("pooling_mode, normalize", [("cls", True), ("mean", False), ("lasttoken", True)])
@pytest.mark.parametrize("source", ["object", "folder"])
def test_haste_pools_as_the_sentence_transformer_and_leaves_out_its_normalize_saying_so_once(
    bert_dir, tmp_path, pooling_mode, normalize, source
):
    st = sentence_transformer(bert_dir, pooling_mode, normalize)
    # What the SentenceTransformer embeds before its Normalize.
    expected = sentence_transformer(bert_dir, pooling_mode, normalize=False).encode(TEXTS, convert_to_tensor=True)
    if source == "folder":
        st.save(str(tmp_path / "st"))
        model, notices = build_and_notices(str(tmp_path / "st"))
        where = f"The SentenceTransformer in {tmp_path / 'st'}"
    else:
        model, notices = build_and_notices(st)
        where = "The SentenceTransformer given as `encoder`"
    assert model.config.pooling == {"lasttoken": "last_token"}.get(pooling_mode, pooling_mode)
    assert model.config.normalize is False
    assert notices == (
        [f"{where} {NOTICE} worse on deps (benchmarks/results/normalize_2026-11-27)."] if normalize else []
    )
    torch.testing.assert_close(haste_embeddings(model, bert_dir), expected, rtol=1e-5, atol=1e-5)
    # Saved and reloaded, the model reads the same features (its config records them: pooling, normalize false).
    model.save_pretrained(tmp_path / "haste")
    saved = json.loads((tmp_path / "haste" / "config.json").read_text())
    assert (saved["pooling"], saved["normalize"]) == (model.config.pooling, False)
    torch.testing.assert_close(
        haste_embeddings(AutoModel.from_pretrained(tmp_path / "haste"), bert_dir), expected, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("source", ["object", "folder"])
def test_a_given_normalize_decides_without_a_notice(bert_dir, tmp_path, source, normalize):
    st = sentence_transformer(bert_dir, "cls")
    if source == "folder":
        st.save(str(tmp_path / "st"))
    model, notices = build_and_notices(str(tmp_path / "st") if source == "folder" else st, normalize=normalize)
    assert (model.config.normalize, notices) == (normalize, [])
    expected = sentence_transformer(bert_dir, "cls", normalize=normalize).encode(TEXTS, convert_to_tensor=True)
    torch.testing.assert_close(haste_embeddings(model, bert_dir), expected, rtol=1e-5, atol=1e-5)


def test_folder_with_a_legacy_pooling_config(bert_dir, tmp_path):
    """Folders written before sentence-transformers 6 (e.g. all-MiniLM-L6-v2) name the mode with booleans."""
    st = sentence_transformer(bert_dir, "cls")
    st.save(str(tmp_path / "st"))
    legacy = {
        "word_embedding_dimension": HIDDEN,
        "pooling_mode_cls_token": True,
        "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }
    (tmp_path / "st" / "1_Pooling" / "config.json").write_text(json.dumps(legacy))
    model = build(str(tmp_path / "st"))
    assert (model.config.pooling, model.config.normalize) == ("cls", False)
    unnormalised = sentence_transformer(bert_dir, "cls", normalize=False).encode(TEXTS, convert_to_tensor=True)
    torch.testing.assert_close(haste_embeddings(model, bert_dir), unnormalised, rtol=1e-5, atol=1e-5)


def test_explicit_pooling_and_normalize_win(bert_dir, tmp_path):
    st = sentence_transformer(bert_dir, "max")
    with pytest.raises(ValueError, match=r"pools with \['max'\].*Pass `pooling=`"):
        build(st)
    model = build(st, pooling="mean", normalize=False)
    assert (model.config.pooling, model.config.normalize) == ("mean", False)
    st.save(str(tmp_path / "st"))
    with pytest.raises(ValueError, match=r"pools with \['max'\]"):
        build(str(tmp_path / "st"))
    assert build(str(tmp_path / "st"), pooling="cls").config.pooling == "cls"


def test_module_chains_haste_cannot_keep_are_refused(bert_dir, tmp_path):
    with_dense = sentence_transformer(bert_dir, extra=[Dense(HIDDEN, 8)])
    with pytest.raises(ValueError, match=r"\['Transformer', 'Pooling', 'Dense', 'Normalize'\].*would be dropped"):
        build(with_dense)
    with_dense.save(str(tmp_path / "st"))
    with pytest.raises(ValueError, match="would be dropped"):
        build(str(tmp_path / "st"))
    with pytest.raises(ValueError, match=r"pools with \['cls', 'mean'\]"):
        build(sentence_transformer(bert_dir, ("cls", "mean")))


def test_a_plain_transformers_folder_is_no_sentence_transformer(bert_dir):
    model = build(str(bert_dir))
    assert (model.config.pooling, model.config.normalize) == ("mean", False)


@pytest.mark.parametrize("module_path", ["../elsewhere", "/tmp/elsewhere", "1_Pooling/../../elsewhere"])
def test_a_folder_whose_modules_lie_outside_it_is_refused(bert_dir, tmp_path, module_path):
    st = sentence_transformer(bert_dir, "cls")
    st.save(str(tmp_path / "st"))
    modules = json.loads((tmp_path / "st" / "modules.json").read_text())
    modules[1]["path"] = module_path
    (tmp_path / "st" / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match=r"modules.json: module path .* points outside the model"):
        build(str(tmp_path / "st"))
