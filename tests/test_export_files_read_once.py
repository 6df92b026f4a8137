"""An ONNX export is served from the bytes its digests were checked on: the graph, the output layer, the label names
and the tokenizer files are each read once, checked, and loaded from those bytes. A tokenizer file the export did not
write (an unlisted `special_tokens_map.json` changed every prediction) is never read, and named in a warning; a file
replaced after the check is not read either."""

import hashlib
import json
import shutil

import onnxruntime
import pytest
from tiny_encoders import tiny_tokenizer
from tiny_haste import make_tiny_model

from haste_hf.export import export_onnx
from haste_hf.onnx_serving import METADATA_FILE, OnnxClassifier


LABELS = 30
TEXTS = ["w3 w40 w50 w7", "w60 w61 w9", "w12 w13 w14 w15 w16", "w1"]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("read-once")
    model = make_tiny_model(LABELS, head_label_count=4, shuffle_labels=True, training=False)
    model.set_label_names([f"tag {i}" for i in range(LABELS)])
    model.save_pretrained(root / "model")
    tiny_tokenizer(root / "model")
    for layout in ("single", "split"):
        export_onnx(str(root / "model"), root / layout, top_k=4, layout=layout)
    return root


@pytest.mark.parametrize("layout", ["single", "split"])
def test_an_unlisted_tokenizer_file_is_never_read(exports, tmp_path, layout):
    expected = OnnxClassifier(exports / layout).predict(TEXTS)
    folder = shutil.copytree(exports / layout, tmp_path / layout)
    # Special tokens that are words of the texts: read, they would change every tokenized text.
    (folder / "special_tokens_map.json").write_text(
        json.dumps({"cls_token": "w3", "sep_token": "w7", "pad_token": "w1", "unk_token": "w9", "mask_token": "w12"})
    )
    with pytest.warns(UserWarning, match="serving ignores: special_tokens_map.json"):
        classifier = OnnxClassifier(folder)
    assert classifier.predict(TEXTS) == expected


@pytest.mark.parametrize("layout", ["single", "split"])
def test_the_graph_loaded_is_the_bytes_checked(exports, monkeypatch, layout):
    loaded = []
    real_session = onnxruntime.InferenceSession

    def session(model, *args, **kwargs):
        loaded.append(model)
        return real_session(model, *args, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", session)
    OnnxClassifier(exports / layout)
    files = json.loads((exports / layout / METADATA_FILE).read_text())["files"]
    graph = "model.onnx" if layout == "single" else "encoder.onnx"
    assert len(loaded) == 1 and isinstance(loaded[0], bytes)  # not a path, which could be read again
    assert hashlib.sha256(loaded[0]).hexdigest() == files[graph]["sha256"]


def test_tokenizer_files_replaced_after_the_check_are_not_read(exports, tmp_path):
    folder = shutil.copytree(exports / "single", tmp_path / "single")
    classifier = OnnxClassifier(folder)
    expected = OnnxClassifier(exports / "single").predict(TEXTS)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # another tokenizer's files, after the check
        (folder / name).write_text((folder / name).read_text().replace('"w3"', '"w3x"'))
    (folder / "special_tokens_map.json").write_text(json.dumps({"cls_token": "w3", "pad_token": "w1"}))
    assert classifier.predict(TEXTS) == expected
