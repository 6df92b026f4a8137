"""An ONNX export is served as one unit or refused: its metadata names every file it wrote (size and sha256), and
`OnnxClassifier` refuses, in one line naming the file, a folder that disagrees with it, carries the mark of an
interrupted export or whose files contradict each other; bad arguments get one-line errors, long texts are cut."""

import json
import shutil
import warnings

import numpy as np
import onnx
import pytest
from tiny_encoders import tiny_tokenizer
from tiny_haste import make_tiny_model

from haste_hf.export import export_onnx
from haste_hf.modeling.saving import INCOMPLETE_SAVE_FILE
from haste_hf.onnx_serving import METADATA_FILE, OnnxClassifier


LABELS = 30
K = 4
NAMES = [f"tag {i}" for i in range(LABELS)]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """A saved model (head of 4 labels, a tail of 26 in groups of 4 with padding, shuffled positions) exported in
    both layouts: {"single": folder, "split": folder}. Its encoder reads at most 64 positions; its tokenizer names
    no length limit."""
    root = tmp_path_factory.mktemp("trusted")
    model = make_tiny_model(LABELS, head_label_count=4, shuffle_labels=True, training=False)
    model.set_label_names(NAMES)
    model.save_pretrained(root / "model")
    tiny_tokenizer(root / "model")
    return {layout: _export(root / "model", root / layout, layout) for layout in ("single", "split")}


def _export(model, folder, layout):
    export_onnx(str(model), folder, top_k=K, layout=layout)
    return folder


@pytest.fixture
def copy_of(exports, tmp_path):
    def copy(layout="single"):
        return shutil.copytree(exports[layout], tmp_path / layout)

    return copy


def metadata(folder) -> dict:
    return json.loads((folder / METADATA_FILE).read_text())


def write_metadata(folder, value: dict):
    (folder / METADATA_FILE).write_text(json.dumps(value))


def refused(folder, naming: str, match: str = ""):
    with pytest.raises(ValueError, match=match) as error:
        OnnxClassifier(folder)
    message = str(error.value)
    assert str(folder / naming) in message and "\n" not in message, message
    return message


def test_an_export_names_its_files_and_serves_as_written(exports):
    for layout, folder in exports.items():
        files = metadata(folder)["files"]
        assert {"label_names.json", "tokenizer_config.json"} <= set(files) and metadata(folder)["max_positions"] == 64
        assert ("model.onnx" if layout == "single" else "encoder.onnx") in files
        graph = onnx.load(folder / metadata(folder)["model_file"], load_external_data=False).graph
        assert metadata(folder)["outputs"] == [output.name for output in graph.output]  # what the graph gives
        classifier = OnnxClassifier(folder)
        assert [row["label"] in NAMES for row in classifier.predict(["w1 w2"])[0]] == [True] * K


@pytest.mark.parametrize("layout", ["single", "split"])
def test_names_shifted_by_one_are_refused(copy_of, layout):
    folder = copy_of(layout)
    (folder / "label_names.json").write_text(json.dumps(["inserted", *NAMES[:-1]]))
    refused(folder, "label_names.json", "damaged or of another export")


def test_names_of_another_label_count_are_refused_without_digests_too(copy_of):
    """An export of an earlier version names no files: what needs no digest is still checked, with a warning (the
    names' count, and that they are a list of strings)."""
    folder = copy_of()
    old = metadata(folder)
    del old["files"], old["max_positions"]
    write_metadata(folder, old)
    (folder / "label_names.json").write_text(json.dumps(["inserted", *NAMES]))
    with pytest.warns(UserWarning, match="names no files"):
        refused(folder, "label_names.json", f"holds {LABELS + 1} names for the export's {LABELS} labels")
    for not_names in (list(range(LABELS)), {name: i for i, name in enumerate(NAMES)}):  # ids; an object of names
        (folder / "label_names.json").write_text(json.dumps(not_names))
        with pytest.warns(UserWarning, match="names no files"):
            refused(folder, "label_names.json", "is not a list of label names")
    (folder / "label_names.json").write_text(json.dumps(NAMES))
    with pytest.warns(UserWarning, match="Export the model again"):
        assert OnnxClassifier(folder).predict(["w1"], k=2)[0][0]["label"] in NAMES


def test_another_models_graph_is_refused(copy_of):
    folder = copy_of()
    graph = onnx.load(folder / "model.onnx")
    weights = max(graph.graph.initializer, key=lambda tensor: len(tensor.raw_data))
    array = onnx.numpy_helper.to_array(weights).copy()
    array.flat[0] += 1.0
    weights.CopyFrom(onnx.numpy_helper.from_array(array, weights.name))
    onnx.save(graph, folder / "model.onnx")  # same size: only the digest tells
    refused(folder, "model.onnx", "not the file the export wrote")


def test_a_cut_graph_and_a_missing_output_layer_are_refused(copy_of):
    folder = copy_of()
    data = (folder / "model.onnx").read_bytes()
    (folder / "model.onnx").write_bytes(data[: len(data) // 2])
    refused(folder, "model.onnx", "bytes where haste_onnx.json says")
    split = copy_of("split")
    (split / "output_layer.safetensors").unlink()
    refused(split, "output_layer.safetensors", "is missing")
    shutil.rmtree(split)
    split = copy_of("split")  # an export of an earlier version, which names no files: read as it stands
    old = metadata(split)
    del old["files"]
    write_metadata(split, old)
    (split / "output_layer.safetensors").unlink()
    with pytest.warns(UserWarning, match="names no files"):
        refused(split, "output_layer.safetensors", "is missing: haste_onnx.json names it. Export the model again")


def test_an_interrupted_export_is_refused(copy_of):
    folder = copy_of()
    (folder / INCOMPLETE_SAVE_FILE).write_text(json.dumps({"files": ["model.onnx"]}))
    refused(folder, INCOMPLETE_SAVE_FILE, "interrupted")


def test_an_output_layer_serving_ids_outside_the_labels_is_refused_even_without_digests(copy_of):
    """Positions mapped to -1 (padding) or past the label count would be served as labels."""
    from safetensors.numpy import load_file, save_file

    for wrong in (-1, LABELS):
        folder = copy_of("split")
        old = metadata(folder)
        del old["files"]
        write_metadata(folder, old)
        weights = load_file(folder / "output_layer.safetensors")
        real = np.flatnonzero(weights["output_labels"] >= 0)
        weights["output_labels"][real[0]] = wrong
        save_file(weights, folder / "output_layer.safetensors")
        with pytest.warns(UserWarning, match="names no files"):
            refused(
                folder, "output_layer.safetensors", f"does not give each of the {LABELS} labels one output position"
            )
        shutil.rmtree(folder)


def test_a_split_head_without_biases_is_served_and_biases_of_another_length_are_refused(copy_of):
    """The split output layer's `head.bias` is optional (the scorer adds none); a head bias that is there has one
    value per head row. Files of an earlier export (no digests), read as they stand: one without head biases ranks as
    one with zero head biases (the head has 4 rows of 32 features)."""
    from safetensors.numpy import load_file, save_file

    def served(change):
        folder = copy_of("split")
        old = metadata(folder)
        del old["files"]
        write_metadata(folder, old)
        weights = load_file(folder / "output_layer.safetensors")
        assert weights["head.weight"].shape == (4, 32)
        change(weights)
        save_file(weights, folder / "output_layer.safetensors")
        try:
            with pytest.warns(UserWarning, match="names no files"):
                return OnnxClassifier(folder).predict(["w1 w2", "w3"], k=LABELS)
        finally:
            shutil.rmtree(folder)

    zero_biases = served(lambda weights: weights["head.bias"].fill(0.0))
    assert served(lambda weights: weights.pop("head.bias")) == zero_biases
    with pytest.raises(ValueError, match="holds a head of inconsistent shapes"):
        served(lambda weights: weights.update({"head.bias": weights["head.bias"][:3].copy()}))


def test_metadata_that_is_damaged_or_names_files_outside_the_folder_is_refused(copy_of):
    folder = copy_of()
    good = metadata(folder)
    for damage, words in (
        ({"top_k": 2.5}, "`top_k` is 2.5"),
        ({"label_count": -1}, "`label_count` is -1"),
        ({"layout": "both"}, "`layout` is 'both'"),
        ({"model_file": "../model.onnx"}, "`model_file` is '../model.onnx'"),
        ({"top_k": K + 1}, f"gives the top {K} labels where haste_onnx.json says {K + 1}"),
    ):
        write_metadata(folder, {**good, **damage})
        message = refused(folder, METADATA_FILE if "top" not in words or "2.5" in words else "model.onnx", words)
        assert "Export the model again" in message
    (folder / METADATA_FILE).write_text("{ not json")
    refused(folder, METADATA_FILE, "unreadable")


def test_bad_arguments_get_one_line_errors_and_long_texts_are_cut(exports):
    for folder in exports.values():
        classifier = OnnxClassifier(folder)
        for texts in (None, "one text", [1, 2], ["a", None]):
            with pytest.raises(ValueError, match="`texts` must be a list of strings"):
                classifier.predict(texts)
        # The value is quoted in at most 60 characters: whole up to 60, else its first 57 and "...".
        for text, shown in (("x" * 58, repr("x" * 58)), ("x" * 59, repr("x" * 59)[:57] + "...")):
            with pytest.raises(ValueError) as error:
                classifier.predict(text)
            assert str(error.value).endswith(f"got {shown}.")
        for k in (2.5, True, 0, LABELS + 1, "3"):
            with pytest.raises(ValueError, match=r"`k` must be an integer in \[1, label_count=30\]"):
                classifier.predict(["w1"], k=k)
        assert classifier.predict([]) == [] and len(classifier.predict(["w1"], k=np.int64(2))[0]) == 2
        label_ids, scores = classifier.top_k(np.zeros((0, 3), np.int64), np.zeros((0, 3), np.int64), k=2)
        assert label_ids.shape == scores.shape == (0, 2)
        # An empty batch of any dtype (numpy's empty arrays are float64) is empty; a float token is refused.
        label_ids, scores = classifier.top_k(np.zeros((0, 3)), np.zeros((0, 3)), k=2)
        assert label_ids.shape == scores.shape == (0, 2)
        for floats in (np.ones((1, 1)) * 0.5, np.ones((2, 3)) * 0.5):
            with pytest.raises(ValueError, match="must be a \\[batch, sequence\\] array of integers"):
                classifier.top_k(floats, np.ones(floats.shape, np.int64))
        with pytest.raises(ValueError, match="`input_ids` is None"):
            classifier.top_k(None, None)
        with pytest.raises(ValueError, match="must have one shape"):
            classifier.top_k(np.ones((2, 3), np.int64), np.ones((2, 4), np.int64))
        with pytest.raises(ValueError, match="rows of 65 tokens; the encoder reads at most 64: truncate"):
            classifier.top_k(np.ones((1, 65), np.int64), np.ones((1, 65), np.int64))
        with pytest.raises(ValueError, match="`input_ids` has rows of no token: give at least one token per row"):
            classifier.top_k(np.ones((2, 0), np.int64), np.ones((2, 0), np.int64))
        long_text = " ".join(["w1"] * 500)  # the tokenizer names no limit: the encoder's positions cut it
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            served = classifier.predict([long_text, "w2"], k=3)
        assert [len(row) for row in served] == [3, 3]
        cut = classifier.predict([" ".join(["w1"] * 62)], k=3)[0]  # 62 words + [CLS], [SEP]
        assert [row["label"] for row in served[0]] == [row["label"] for row in cut]
        np.testing.assert_allclose([row["score"] for row in served[0]], [row["score"] for row in cut], atol=1e-5)


def test_the_split_output_layer_is_served_from_the_checked_bytes_without_a_copy(exports, copy_of):
    """The output layer's arrays are read-only views onto the one buffer of the file's checked bytes (issue 37:
    `safetensors.numpy.load` copied each tensor out of them, twice the memory of 8.6M labels while it loaded), with
    the file's values; a file cut short is refused in one line that names it."""
    from safetensors.numpy import load_file

    folder = exports["split"]
    served = OnnxClassifier(folder).output_layer
    expected = load_file(folder / "output_layer.safetensors")
    assert served.keys() == expected.keys()
    buffers = set()
    for name, array in served.items():
        assert (
            array.dtype == expected[name].dtype and np.array_equal(array, expected[name]) and not array.flags.writeable
        )
        root = array
        while isinstance(root, np.ndarray):
            root = root.base
        buffers.add(id(root.obj))  # a memoryview of the file's bytes
    assert len(buffers) == 1
    cut = copy_of("split")
    old = metadata(cut)
    del old["files"]  # no digests: the bytes themselves are checked
    write_metadata(cut, old)
    data = (cut / "output_layer.safetensors").read_bytes()
    (cut / "output_layer.safetensors").write_bytes(data[:-8])
    with pytest.warns(UserWarning, match="names no files"):
        refused(cut, "output_layer.safetensors", "is not a whole safetensors file")
