"""Publishing HASTE models and loading them back through the real `huggingface_hub` client and transformers,
talking HTTP to the test Hub server (`tests/hub_server.py`), and read-only through olah as a cross-check."""

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
import types
import uuid
from functools import partial
from pathlib import Path

import processes
import pytest
import torch
from datasets import Dataset
from huggingface_hub import CommitOperationDelete, HfApi, ModelCard, hf_hub_download
from tiny_encoders import VOCAB_SIZE, planted_texts, tiny_encoder_config, tiny_tokenizer
from tiny_haste import make_tiny_model, make_tiny_trainer
from transformers import AutoModel, BertModel

import haste_hf.hub  # registers the auto classes; its HfApi is replaced offline
from haste_hf import HASTE_FORMAT_VERSION, HasteForExtremeClassification
from haste_hf.hub import AUTO_MAP, push_to_hub
from haste_hf.modeling.saving import LABEL_NAMES_FILE, exported_code_files


LABELS = 40
CODE_FILES = {"configuration_haste.py", "modeling_haste.py", "sparse_ops.py"}


make_model = partial(
    make_tiny_model, label_count=LABELS, tail_projection_dim=16, tail_bias=True, shuffle_labels=True, training=False
)


def batch(seed=0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, VOCAB_SIZE, (3, 7), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 4:] = 0
    return input_ids, attention_mask


def outputs(model):
    with torch.no_grad():
        return model(*batch(), return_logits=True).logits


def assert_same_model(loaded, model):
    assert loaded.state_dict().keys() == model.state_dict().keys()
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert (
        loaded.output_layer.tail.supports.dtype == torch.int32
        and loaded.output_layer.output_labels.dtype == torch.int64
    )
    torch.testing.assert_close(outputs(loaded.eval()), outputs(model), rtol=0, atol=0)


def new_repo_id(hub, stem):
    return f"{hub.user}/{stem}-{uuid.uuid4().hex[:8]}"


def run_python(script, env=None, cwd=None):
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result.stdout


# Loads a repository in a fresh interpreter where `haste_hf` cannot be imported, and saves its outputs.
REMOTE_CODE_SCRIPT = """
    import sys
    sys.modules["haste_hf"] = None  # hides the package, installed or in the working directory
    try:
        import haste_hf  # noqa: F401  (registers the auto classes)
    except ImportError:
        pass
    else:
        raise SystemExit("haste_hf is importable")
    import torch
    from transformers import AutoModel
    try:
        AutoModel.from_pretrained({repo_id!r}, revision={revisions!r}[0])
    except ValueError as error:
        assert "trust_remote_code=True" in str(error), error
    else:
        raise SystemExit("loaded custom code without trust_remote_code=True")
    results = {{}}
    for revision in {revisions!r}:
        model = AutoModel.from_pretrained({repo_id!r}, revision=revision, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        with torch.no_grad():
            results[revision] = model(*torch.load({batch_path!r}), return_logits=True).logits
        results[revision + ":labels"] = model.label_names
    torch.save(results, {out_path!r})
"""


def load_with_remote_code(repo_id, revisions, tmp_path):
    torch.save(batch(), tmp_path / "batch.pt")
    script = REMOTE_CODE_SCRIPT.format(
        repo_id=repo_id,
        revisions=revisions,
        batch_path=str(tmp_path / "batch.pt"),
        out_path=str(tmp_path / "remote.pt"),
    )
    run_python(script, env={"HF_MODULES_CACHE": str(tmp_path / "modules"), "PYTHONPATH": str(tmp_path)}, cwd=tmp_path)
    return torch.load(tmp_path / "remote.pt")


# ---- what a push sends, offline: a recording HfApi in place of the Hub ------------------------------------------


class RecordingApi:
    """`HfApi` as `push_to_hub` calls it: a repository that holds `REMOTE`, the calls recorded, each file of the
    commit read when it is made (the staging folder is gone after)."""

    REMOTE: list[str] = []
    calls: list = []

    def __init__(self, token=None):
        RecordingApi.calls.append(("token", token))

    def create_repo(self, repo_id, private=None, exist_ok=False):
        RecordingApi.calls.append(("create_repo", repo_id, private))
        return types.SimpleNamespace(repo_id=repo_id if "/" in repo_id else f"me/{repo_id}")

    def create_branch(self, repo_id, branch, exist_ok=False):
        RecordingApi.calls.append(("create_branch", repo_id, branch))

    def list_repo_files(self, repo_id, revision=None):
        RecordingApi.calls.append(("list_repo_files", revision))
        return list(RecordingApi.REMOTE)

    def create_commit(self, repo_id, operations, **fields):
        added, deleted = {}, []
        for operation in operations:
            if isinstance(operation, CommitOperationDelete):
                deleted.append(operation.path_in_repo)
                continue
            source = operation.path_or_fileobj
            assert operation.path_in_repo not in added, operation.path_in_repo  # each file once
            added[operation.path_in_repo] = Path(source).read_bytes() if isinstance(source, str) else source.read()
        RecordingApi.calls.append(("create_commit", repo_id, added, deleted, fields))
        return "https://hub.example/commit/1"


@pytest.fixture
def recorded(monkeypatch):
    """Pushes go to a `RecordingApi`; returns a function giving the last commit's `(added, deleted, fields)`."""
    monkeypatch.setattr(haste_hf.hub, "HfApi", RecordingApi)
    RecordingApi.REMOTE, RecordingApi.calls = [], []

    def last_commit():
        _, _, added, deleted, fields = [call for call in RecordingApi.calls if call[0] == "create_commit"][-1]
        return added, deleted, fields

    return last_commit


def saved_folder(tmp_path, **files):
    folder = tmp_path / "model"
    make_model().save_pretrained(folder)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def test_a_folder_push_sends_its_files_the_code_and_a_config_naming_the_code_in_one_commit(tmp_path, recorded):
    folder = saved_folder(tmp_path, **{"notes.txt": "kept"})
    (folder / "checkpoint-2").mkdir()
    (folder / "checkpoint-2" / "optimizer.pt").write_bytes(b"never published")
    (folder / ".hidden").write_text("never published")
    RecordingApi.REMOTE = ["model-00001-of-00002.safetensors", "model.safetensors.index.json", "old.txt"]
    assert push_to_hub(folder, "tiny", token="secret") == "https://hub.example/commit/1"
    added, deleted, fields = recorded()
    code = {os.path.basename(path) for path in exported_code_files()}
    assert set(added) == {"config.json", "model.safetensors", "notes.txt", "README.md"} | code
    assert added["model.safetensors"] == (folder / "model.safetensors").read_bytes() and added["notes.txt"] == b"kept"
    assert json.loads(added["config.json"])["auto_map"] == AUTO_MAP
    assert sorted(deleted) == ["model-00001-of-00002.safetensors", "model.safetensors.index.json"]  # shadowing weights
    assert fields == dict(commit_message="Upload HASTE model", commit_description=None, revision=None, create_pr=False)
    assert ("token", "secret") in RecordingApi.calls and ("list_repo_files", None) in RecordingApi.calls
    assert not any(call[0] == "create_branch" for call in RecordingApi.calls)


@pytest.mark.parametrize(
    "revision, create_pr, branch, listed",
    [("dev", False, "dev", "dev"), ("refs/pr/3", False, None, "refs/pr/3"), ("dev", True, "dev", "main")],
)
def test_a_push_to_a_revision_makes_its_branch_and_a_pull_request_compares_with_main(
    tmp_path, recorded, revision, create_pr, branch, listed
):
    push_to_hub(saved_folder(tmp_path), "me/tiny", revision=revision, create_pr=create_pr, commit_message="Mine")
    _, _, fields = recorded()
    assert fields["revision"] == revision and fields["create_pr"] is create_pr and fields["commit_message"] == "Mine"
    branches = [call[2] for call in RecordingApi.calls if call[0] == "create_branch"]
    assert branches == ([] if branch is None else [branch])
    assert ("list_repo_files", listed) in RecordingApi.calls


def test_a_model_object_push_is_saved_in_the_shards_asked(tmp_path, recorded):
    model = make_model()
    push_to_hub(model, "me/tiny", max_shard_size="20KB")
    added, _, _ = recorded()
    shards = sorted(name for name in added if name.startswith("model-"))
    assert len(shards) > 1 and "model.safetensors.index.json" in added and "model.safetensors" not in added
    push_to_hub(model, "me/tiny")
    added, _, _ = recorded()
    assert "model.safetensors" in added and not any(name.startswith("model-") for name in added)


def test_label_names_a_tokenizer_and_tags_go_with_the_push(tmp_path, recorded):
    folder = saved_folder(tmp_path, **{"README.md": "---\ntags:\n- haste\n---\n# Our card\n"})
    names = [f"label {i}" for i in range(LABELS)]
    push_to_hub(folder, "me/tiny", label_names=names, tokenizer=tiny_tokenizer(tmp_path / "tok"), tags=["demo"])
    added, _, _ = recorded()
    assert json.loads(added[LABEL_NAMES_FILE]) == names
    assert "tokenizer_config.json" in added and "tokenizer.json" in added
    card = added["README.md"].decode()
    assert "# Our card" in card and "- haste\n- demo" in card


@pytest.mark.parametrize("kind", ["text", "card", "data"])
def test_a_card_given_replaces_the_folders(tmp_path, recorded, kind):
    from haste_hf.model_card import HasteModelCardData

    given = {
        "text": "# Given card\n",
        "card": ModelCard("---\nlicense: mit\n---\n# Given card\n"),
        "data": HasteModelCardData.from_model(make_model(), model_id="me/given-card"),
    }[kind]
    push_to_hub(saved_folder(tmp_path, **{"README.md": "# Folder card\n"}), "me/tiny", model_card=given)
    card = recorded()[0]["README.md"].decode()
    assert "Folder card" not in card and ("me/given-card" in card if kind == "data" else "# Given card" in card)


def test_without_a_card_one_is_rendered_from_the_config(tmp_path, recorded):
    push_to_hub(saved_folder(tmp_path), "me/tiny")
    assert "me/tiny" in recorded()[0]["README.md"].decode()


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        (dict(max_shard_size="1MB"), ValueError, "`max_shard_size` re-shards a model object's weights"),
        (dict(label_names=["a", "b"]), ValueError, f"`label_names` has 2 entries for {LABELS} labels"),
        (dict(model_card=3), TypeError, "`model_card` must be a ModelCard, a str or a HasteModelCardData, got int"),
    ],
)
def test_a_push_with_arguments_that_cannot_hold_is_refused_before_a_commit(
    tmp_path, recorded, arguments, error, message
):
    with pytest.raises(error, match=re.escape(message)):
        push_to_hub(saved_folder(tmp_path), "me/tiny", **arguments)
    assert not any(call[0] == "create_commit" for call in RecordingApi.calls)


def test_a_model_that_is_not_a_haste_model_is_refused(recorded):
    with pytest.raises(TypeError, match=r"`model` must be a HASTE model .* got BertModel \(model_type 'bert'\)"):
        push_to_hub(BertModel(tiny_encoder_config("bert")), "me/tiny")


@pytest.mark.parametrize(
    "config, message",
    [
        (None, "has no config.json: give the folder a HASTE model was saved to"),
        ("{not json", "config.json is not JSON"),
        ("[1, 2]", "holds a None model, not a HASTE one"),
        ('{"model_type": "bert"}', "holds a 'bert' model, not a HASTE one"),
    ],
)
def test_a_folder_that_holds_no_haste_model_is_refused_naming_why(tmp_path, recorded, config, message):
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "weights.bin").symlink_to(tmp_path / "elsewhere")  # named only once the folder holds a model
    if config is not None:
        (folder / "weights.bin").unlink()
        (folder / "config.json").write_text(config)
    with pytest.raises(ValueError, match=re.escape(message)):
        push_to_hub(folder, "me/tiny")


def test_the_files_published_are_the_regular_ones_sent_sorted_never_checkpoints_logs_or_hidden(tmp_path):
    from haste_hf.hub import IGNORED_IN_FOLDERS, publishable_files

    for name in ("b.txt", "a.txt", "sub/c.txt", "checkpoint-3/optimizer.pt", "runs/events", ".hidden/x", ".git/HEAD"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    assert publishable_files(tmp_path, IGNORED_IN_FOLDERS) == ["a.txt", "b.txt", "sub/c.txt"]
    assert publishable_files(tmp_path, []) == [
        ".hidden/x",
        "a.txt",
        "b.txt",
        "checkpoint-3/optimizer.pt",
        "runs/events",
        "sub/c.txt",
    ]


def test_a_link_or_a_fifo_in_a_published_folder_is_refused_naming_it(tmp_path):
    from haste_hf.hub import publishable_files

    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "link").symlink_to(tmp_path / "a.txt")
    with pytest.raises(ValueError, match=r"link is a link \(to .*a\.txt\): only regular files inside the folder"):
        publishable_files(tmp_path, [])
    (tmp_path / "link").unlink()
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ValueError, match="pipe is not a regular file: only regular files are published; remove it"):
        publishable_files(tmp_path, [])
    assert publishable_files(tmp_path, ["pipe"]) == ["a.txt"]


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_published_file_is_read_as_opened_and_leaves_no_descriptor_open(tmp_path):
    from haste_hf.hub import open_published_file

    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "sub" / "deeper" / "file.bin").write_bytes(b"weights")
    (tmp_path / "top.bin").write_bytes(b"top")
    before = open_descriptors()
    for relative, content in (("sub/deeper/file.bin", b"weights"), ("top.bin", b"top")):
        with open_published_file(tmp_path, relative) as file:
            assert file.read() == content
    assert open_descriptors() == before


@pytest.mark.parametrize("kind", ["last link", "folder link", "fifo"])
def test_a_published_file_behind_a_link_or_not_regular_is_refused_and_leaves_no_descriptor_open(tmp_path, kind):
    from haste_hf.hub import open_published_file

    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "file.bin").write_bytes(b"secret")
    if kind == "last link":
        (tmp_path / "real" / "link.bin").symlink_to(tmp_path / "real" / "file.bin")
        relative = "real/link.bin"
    elif kind == "folder link":
        (tmp_path / "linked").symlink_to(tmp_path / "real")
        relative = "linked/file.bin"
    else:
        os.mkfifo(tmp_path / "real" / "pipe")  # opened without blocking: refused, not a hang
        relative = "real/pipe"
    before = open_descriptors()
    with pytest.raises(ValueError, match="is a link, or not a regular file"):
        open_published_file(tmp_path, relative)
    assert open_descriptors() == before


def test_a_missing_published_file_is_the_systems_error(tmp_path):
    from haste_hf.hub import open_published_file

    before = open_descriptors()
    with pytest.raises(FileNotFoundError):
        open_published_file(tmp_path, "gone/file.bin")
    assert open_descriptors() == before


def test_the_staged_files_leave_out_hidden_files_and_folders(tmp_path):
    from haste_hf.hub import _staged_files

    for name in ("b.json", "a.json", "code/x.py", ".marks/id", ".save-id"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert _staged_files(tmp_path) == ["a.json", "b.json", "code/x.py"]


@pytest.mark.parametrize("given", [None, "*.tmp", ["*.tmp", "logs/**"]])
def test_the_trainers_uploads_leave_out_the_marks_of_saves_beside_the_patterns_given(monkeypatch, given):
    import transformers.trainer

    from haste_hf.hub import INTERNAL_PATTERNS, trainer_uploads_without_internal_files

    uploads = []
    shared = types.SimpleNamespace(
        upload_folder=lambda *args, **kwargs: uploads.append((args, kwargs)) or "uploaded", repo_info=lambda: "info"
    )
    monkeypatch.setattr(transformers.trainer, "hf_api", lambda: shared, raising=False)
    original = transformers.trainer.hf_api
    with trainer_uploads_without_internal_files():
        api = transformers.trainer.hf_api()
        assert api.upload_folder("folder", ignore_patterns=given, repo_id="me/run") == "uploaded"
        assert api.repo_info() == "info"  # everything else is the shared api's
    assert transformers.trainer.hf_api is original
    expected = [] if given is None else [given] if isinstance(given, str) else given
    assert uploads == [(("folder",), {"ignore_patterns": [*expected, *INTERNAL_PATTERNS], "repo_id": "me/run"})]


def test_a_transformers_whose_trainer_uploads_through_no_hf_api_is_refused(monkeypatch):
    import transformers.trainer

    from haste_hf.hub import trainer_uploads_without_internal_files

    monkeypatch.delattr(transformers.trainer, "hf_api", raising=False)
    with (
        pytest.raises(RuntimeError, match="uploads through no `hf_api\\(\\)`.*haste-hf push"),
        trainer_uploads_without_internal_files(),
    ):
        pass


# ---- push, then load with and without the package ------------------------------------------------


def test_push_then_load_with_the_package_and_with_remote_code(hub, tmp_path):
    model = make_model()
    names = [f"label {i}" for i in range(LABELS)]
    repo_id = new_repo_id(hub, "haste")
    commit = push_to_hub(model, repo_id, label_names=names, commit_message="First HASTE model", private=True)

    api = HfApi()
    files = set(api.list_repo_files(repo_id))
    assert {"config.json", "model.safetensors", LABEL_NAMES_FILE, "README.md"} | CODE_FILES <= files
    assert api.model_info(repo_id).private is True
    assert api.list_repo_commits(repo_id)[0].title == "First HASTE model" and commit.oid == api.model_info(repo_id).sha
    config = json.loads(Path(api.hf_hub_download(repo_id, "config.json")).read_text())
    assert config["auto_map"] == AUTO_MAP and config["format_version"] == 3  # the oldest format holding it
    card = ModelCard.load(repo_id)
    assert "haste" in card.data.tags and "trust_remote_code=True" in card.text and repo_id in card.text

    loaded = AutoModel.from_pretrained(repo_id)
    assert type(loaded) is HasteForExtremeClassification and loaded.label_names == names
    assert_same_model(loaded, model)

    remote = load_with_remote_code(repo_id, ["main"], tmp_path)
    torch.testing.assert_close(remote["main"], outputs(model), rtol=0, atol=0)
    assert remote["main:labels"] == names


def test_the_exported_code_pushes_without_the_marks_of_its_save(hub, tmp_path):
    """Without `haste_hf`, `model.push_to_hub` is transformers' (save into a temporary folder, upload what it holds):
    the model, its names, code and card go, the marks of the save do not."""
    source, target = new_repo_id(hub, "remote-source"), new_repo_id(hub, "remote-push")
    push_to_hub(make_model(), source, label_names=[f"label {i}" for i in range(LABELS)])
    script = f"""
        import sys
        sys.modules["haste_hf"] = None  # hides the package
        from transformers import AutoModel
        model = AutoModel.from_pretrained({source!r}, trust_remote_code=True)
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        model.push_to_hub({target!r})
    """
    run_python(script, env={"HF_MODULES_CACHE": str(tmp_path / "modules"), "PYTHONPATH": str(tmp_path)}, cwd=tmp_path)
    files = set(HfApi().list_repo_files(target))
    assert {"config.json", "model.safetensors", LABEL_NAMES_FILE, "README.md"} | CODE_FILES <= files
    assert internal_files(target) == []


def test_revisions_branches_and_commit_shas(hub, tmp_path):
    repo_id = new_repo_id(hub, "revisions")
    first, second = make_model(seed=1), make_model(seed=2)
    first_commit = push_to_hub(first, repo_id).oid
    push_to_hub(second, repo_id, revision="experiment", commit_message="Second model", commit_description="Seed 2.")
    assert {ref.name for ref in HfApi().list_repo_refs(repo_id).branches} == {"main", "experiment"}
    commits = HfApi().list_repo_commits(repo_id, revision="experiment")
    assert (commits[0].title, commits[0].message) == ("Second model", "Seed 2.")

    assert_same_model(AutoModel.from_pretrained(repo_id), first)
    assert_same_model(AutoModel.from_pretrained(repo_id, revision="experiment"), second)
    push_to_hub(second, repo_id)  # main moves on; the first commit still loads
    assert_same_model(AutoModel.from_pretrained(repo_id, revision=first_commit), first)

    remote = load_with_remote_code(repo_id, [first_commit, "experiment"], tmp_path)
    torch.testing.assert_close(remote[first_commit], outputs(first), rtol=0, atol=0)
    torch.testing.assert_close(remote["experiment"], outputs(second), rtol=0, atol=0)


def test_model_push_to_hub_publishes_code_and_card(hub):
    model = make_model()
    repo_id = new_repo_id(hub, "method")
    model.push_to_hub(repo_id, commit_message="Via the model", revision="v1")
    files = set(HfApi().list_repo_files(repo_id, revision="v1"))
    assert CODE_FILES | {"config.json", "model.safetensors", "README.md"} <= files
    assert "haste" in ModelCard.load(hf_hub_download(repo_id, "README.md", revision="v1")).data.tags
    assert_same_model(AutoModel.from_pretrained(repo_id, revision="v1"), model)


def test_push_a_saved_folder_with_its_card_and_replaced_files(hub, tmp_path):
    model = make_model()
    model.set_label_names([f"n{i}" for i in range(LABELS)])
    folder = tmp_path / "out"
    model.save_pretrained(folder)
    tiny_tokenizer(folder)
    (folder / "README.md").write_text("---\ntags:\n- haste\n---\n# Our own card\n")
    (folder / "checkpoint-4").mkdir()
    (folder / "checkpoint-4" / "optimizer.pt").write_bytes(b"not published")
    before = {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()}
    repo_id = new_repo_id(hub, "folder")
    new_names = [f"renamed {i}" for i in range(LABELS)]
    push_to_hub(folder, repo_id, tags=["demo"], label_names=new_names, tokenizer=tiny_tokenizer(tmp_path / "tok"))

    files = set(HfApi().list_repo_files(repo_id))
    assert CODE_FILES | {"config.json", "tokenizer_config.json", LABEL_NAMES_FILE} <= files
    assert not any(name.startswith("checkpoint-") for name in files)
    card = ModelCard.load(repo_id)
    assert card.text.strip() == "# Our own card" and card.data.tags == ["haste", "demo"]
    loaded = AutoModel.from_pretrained(repo_id)
    assert_same_model(loaded, model)
    assert loaded.label_names == new_names
    # The folder is untouched: the staged config, names, card and tokenizer files replaced links to it.
    assert {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()} == before


def test_cli_push(hub, tmp_path, capsys):
    cli = pytest.importorskip("haste_hf.cli.commands")
    model = make_model()
    model.save_pretrained(tmp_path / "out")
    repo_id = new_repo_id(hub, "cli")
    argv = [
        "push",
        "--model",
        str(tmp_path / "out"),
        "--repo-id",
        repo_id,
        "--private",
        "--revision",
        "release",
        "--commit-message",
        "From the CLI",
    ]
    assert cli.main(argv) == 0
    assert repo_id in capsys.readouterr().out
    api = HfApi()
    assert api.model_info(repo_id).private is True
    assert api.list_repo_commits(repo_id, revision="release")[0].title == "From the CLI"
    assert set(api.list_repo_files(repo_id, revision="release")) >= CODE_FILES
    assert "haste" in ModelCard.load(hf_hub_download(repo_id, "README.md", revision="release")).data.tags
    assert_same_model(AutoModel.from_pretrained(repo_id, revision="release"), model)


# ---- sharding and size ---------------------------------------------------------------------------


def test_sharded_round_trip_and_reshard(hub):
    model = make_model(label_count=4000, group_size=8, fan_in=16)
    repo_id = new_repo_id(hub, "sharded")
    push_to_hub(model, repo_id, max_shard_size="100KB")
    files = set(HfApi().list_repo_files(repo_id))
    shards = {name for name in files if name.startswith("model-") and name.endswith(".safetensors")}
    assert len(shards) >= 2 and "model.safetensors.index.json" in files and "model.safetensors" not in files
    assert_same_model(AutoModel.from_pretrained(repo_id), model)
    # One file again: the stale shards and index go in the same commit.
    push_to_hub(model, repo_id)
    files = set(HfApi().list_repo_files(repo_id))
    assert "model.safetensors" in files and not files & (shards | {"model.safetensors.index.json"})
    assert_same_model(AutoModel.from_pretrained(repo_id), model)


def test_model_over_100_mb(hub):
    # 13,000 groups of 64 labels with fan-in 32: a 106 MB tail weight in one 115 MB safetensors file.
    model = make_model(label_count=13_000 * 64, head_label_count=0, group_size=64, fan_in=32, tail_projection_dim=None)
    repo_id = new_repo_id(hub, "large")
    started = time.time()
    push_to_hub(model, repo_id)
    pushed = time.time()
    size = {entry.path: entry.size for entry in HfApi().list_repo_tree(repo_id)}["model.safetensors"]
    assert size > 100e6
    loaded = AutoModel.from_pretrained(repo_id)
    print(f"{size / 1e6:.0f} MB: push {pushed - started:.1f} s, download + load {time.time() - pushed:.1f} s")
    assert torch.equal(loaded.output_layer.tail.weight, model.output_layer.tail.weight) and torch.equal(
        loaded.output_layer.tail.supports, model.output_layer.tail.supports
    )
    assert torch.equal(loaded.output_layer.output_labels, model.output_layer.output_labels)


# ---- Trainer -------------------------------------------------------------------------------------


def train_and_push(hub, tmp_path, hub_strategy="every_save"):
    """A HasteTrainer run of 4 steps pushing every 2 steps to a private repository; (trainer, repo_id)."""
    tokenizer = tiny_tokenizer(tmp_path / "tokenizer")
    repo_id = new_repo_id(hub, "trainer")
    trainer = make_tiny_trainer(
        tmp_path / "out",
        tokenizer,
        Dataset.from_list(planted_texts(LABELS, 16, seed=0)),
        make_model(),
        processing_class=tokenizer,
        per_device_train_batch_size=4,
        max_steps=4,
        save_strategy="steps",
        save_steps=2,
        learning_rate=1e-3,
        output_learning_rate=0.1,
        rewiring_interval=0,
        push_to_hub=True,
        hub_model_id=repo_id,
        hub_strategy=hub_strategy,
        hub_private_repo=True,
        # Otherwise a save whose predecessor's (background) push is still running is not pushed at all.
        hub_always_push=True,
    )
    trainer.train()
    if trainer.push_in_progress is not None:
        trainer.push_in_progress.wait_until_done()
    return trainer, repo_id


@pytest.fixture(scope="module")
def trained(hub, tmp_path_factory):
    return train_and_push(hub, tmp_path_factory.mktemp("trainer"))


def internal_files(repo_id: str) -> list[str]:
    """The marks and staging folders of the program's saves (`.haste-*`) that a repository holds."""
    return [name for name in HfApi().list_repo_files(repo_id) if "/.haste-" in "/" + name]


def test_trainer_pushes_every_save(trained):
    trainer, repo_id = trained
    api = HfApi()
    titles = [commit.title for commit in api.list_repo_commits(repo_id)]
    # Each save queues a background upload of `output_dir`, which the next save may overwrite before the upload
    # reads it: the last pushed commit holds the final weights but may carry an earlier step's title, and a
    # later upload that then finds nothing changed makes no commit.
    assert titles[-1] == "initial commit" and titles[0].startswith("Training in progress, step ")
    assert set(titles[:-1]) <= {"Training in progress, step 2", "Training in progress, step 4"}
    assert api.model_info(repo_id).private is True
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} | CODE_FILES <= set(
        api.list_repo_files(repo_id)
    )
    assert_same_model(AutoModel.from_pretrained(repo_id), trainer.model.eval())
    assert internal_files(repo_id) == []


def test_trainer_final_push_publishes_the_haste_card(trained):
    trainer, repo_id = trained
    trainer.push_to_hub(commit_message="End of training")
    api = HfApi()
    assert api.list_repo_commits(repo_id)[0].title == "End of training"
    card = ModelCard.load(repo_id)
    assert "haste" in card.data.tags and "SGD" in card.text  # the HASTE card, naming both optimizers
    assert_same_model(AutoModel.from_pretrained(repo_id), trainer.model.eval())
    assert os.path.isfile(os.path.join(trainer.args.output_dir, ".haste-save-generation"))  # there, not pushed
    assert internal_files(repo_id) == []


def test_trainer_pushes_its_checkpoints_without_the_marks_of_its_saves(hub, tmp_path):
    trainer, repo_id = train_and_push(hub, tmp_path, hub_strategy="all_checkpoints")
    files = HfApi().list_repo_files(repo_id)
    assert {"checkpoint-2/model.safetensors", "checkpoint-4/model.safetensors", "config.json"} <= set(files)
    assert os.path.isfile(os.path.join(trainer.args.output_dir, "checkpoint-4", ".haste-save-generation"))
    assert internal_files(repo_id) == []


# ---- errors --------------------------------------------------------------------------------------


def test_missing_repo_and_wrong_revision(hub):
    with pytest.raises(OSError, match="no-such-model is not a local folder and is not a valid model identifier"):
        AutoModel.from_pretrained(f"{hub.user}/no-such-model")
    repo_id = new_repo_id(hub, "errors")
    push_to_hub(make_model(), repo_id)
    with pytest.raises(OSError, match="no-such-branch is not a valid git identifier"):
        AutoModel.from_pretrained(repo_id, revision="no-such-branch")
    with pytest.raises(TypeError, match="model_type 'haste_xmc'.*got BertModel \\(model_type 'bert'\\)"):
        push_to_hub(BertModel(tiny_encoder_config("bert")), repo_id)


def upload_raw_checkpoint(tmp_path, repo_id, config_update):
    """Pushes a checkpoint folder as is (no `haste_hf.hub` checks), after editing its config.json."""
    folder = tmp_path / "raw"
    model = make_model()
    model.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(config_update)
    (folder / "config.json").write_text(json.dumps(config))
    HfApi().create_repo(repo_id)
    HfApi().upload_folder(repo_id=repo_id, folder_path=folder)
    return folder


def test_newer_format_version_is_refused_with_an_upgrade_hint(hub, tmp_path):
    repo_id = new_repo_id(hub, "future")
    folder = upload_raw_checkpoint(tmp_path, repo_id, {"format_version": HASTE_FORMAT_VERSION + 1})
    with pytest.raises(ValueError, match=r"format_version.*upgrade haste_hf"):
        AutoModel.from_pretrained(repo_id)
    with pytest.raises(ValueError, match="upgrade haste_hf"):
        push_to_hub(folder, new_repo_id(hub, "future-push"))


def test_checkpoint_of_another_model_type_is_refused(hub, tmp_path):
    repo_id = new_repo_id(hub, "bert")
    folder = tmp_path / "bert"
    BertModel(tiny_encoder_config("bert")).save_pretrained(folder)
    HfApi().create_repo(repo_id)
    HfApi().upload_folder(repo_id=repo_id, folder_path=folder)
    with pytest.raises(ValueError, match="'bert'.*HASTE|HASTE.*'bert'"):
        HasteForExtremeClassification.from_pretrained(repo_id)


def test_pushing_a_folder_of_another_model_type_is_refused(hub, tmp_path):
    BertModel(tiny_encoder_config("bert")).save_pretrained(tmp_path / "bert")
    with pytest.raises(ValueError, match="holds a 'bert' model, not a HASTE one"):
        push_to_hub(tmp_path / "bert", new_repo_id(hub, "bert-push"))


# ---- cross-check against an existing server: olah, a read-only mirror of the same git repositories ----


def olah_command():
    if importlib.util.find_spec("olah") is not None:
        return [sys.executable, "-c", "from olah.server import cli; cli()"]
    if os.environ.get("HASTE_OLAH_CLI"):  # an olah installed apart, e.g. in its own virtual environment
        return [os.environ["HASTE_OLAH_CLI"]]
    return None


@pytest.mark.skipif(olah_command() is None, reason="olah is not installed (pip install olah)")
def test_olah_serves_the_pushed_repository(hub, tmp_path):
    model = make_model(seed=3)
    repo_id = new_repo_id(hub, "olah")
    push_to_hub(model, repo_id, label_names=[f"l{i}" for i in range(LABELS)])

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Files come from the mirrored git repositories; olah asks its upstream, the test Hub, only about what they
    # lack. Offline, olah answers 401 (RepoNotFound) for a file a repository lacks, where the Hub answers 404
    # (EntryNotFound): transformers, which probes `adapter_config.json` when peft is installed, then takes the
    # whole repository for missing.
    upstream = hub.url.split("://", 1)[1]
    (tmp_path / "olah.toml").write_text(
        f'[basic]\nhost = "127.0.0.1"\nport = {port}\nrepos-path = "{tmp_path / "olah-cache"}"\n'
        f'mirrors-path = ["{hub.root}"]\nhf-scheme = "http"\nhf-netloc = "{upstream}"\nhf-lfs-netloc = "{upstream}"\n'
        f"[accessibility]\noffline = false\n"
    )
    olah = processes.start(
        olah_command() + ["-c", str(tmp_path / "olah.toml")],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={key: value for key, value in os.environ.items() if not key.startswith("HF_")},
    )
    try:
        olah_url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                if olah.poll() is not None:
                    pytest.fail("olah exited at start")
                time.sleep(0.1)
        torch.save(batch(), tmp_path / "batch.pt")
        script = f"""
            import torch
            import haste_hf  # noqa: F401  (registers the auto classes)
            from huggingface_hub import snapshot_download
            from transformers import AutoModel
            files = sorted(__import__("os").listdir(snapshot_download({repo_id!r})))
            assert {{"config.json", "model.safetensors", "modeling_haste.py", "label_names.json"}} <= set(files), files
            model = AutoModel.from_pretrained({repo_id!r}).eval()
            with torch.no_grad():
                logits = model(*torch.load({str(tmp_path / "batch.pt")!r}), return_logits=True).logits
            torch.save({{"logits": logits, "labels": model.label_names}}, {str(tmp_path / "olah.pt")!r})
        """
        env = {"HF_ENDPOINT": olah_url, "HF_HUB_CACHE": str(tmp_path / "olah-client-cache"), "HF_TOKEN": ""}
        run_python(script, env=env)
    finally:
        processes.kill_group(olah.pid)
        olah.wait()
    served = torch.load(tmp_path / "olah.pt")
    torch.testing.assert_close(served["logits"], outputs(model), rtol=0, atol=0)
    assert served["labels"] == [f"l{i}" for i in range(LABELS)]


def test_a_push_publishes_the_model_and_its_card_never_the_programs_marks(hub, tmp_path, capsys):
    """A model object is saved into a staging folder (which gets the save's id), a folder holds the id and a run's
    lock: none of the program's marks is published, by the API or the command line."""
    from haste_hf.cli import main

    model = make_tiny_model(12)
    model.set_label_names([f"label {i}" for i in range(12)])
    by_object = f"{hub.user}/marks-{uuid.uuid4().hex[:8]}"
    push_to_hub(model, by_object)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    (folder / ".haste-train.lock").write_text("{}")
    assert (folder / ".haste-save-generation").is_file()
    by_folder = f"{hub.user}/marks-{uuid.uuid4().hex[:8]}"
    assert main(["push", "--model", str(folder), "--repo-id", by_folder]) == 0
    for repo_id in (by_object, by_folder):
        files = HfApi().list_repo_files(repo_id)
        assert {"config.json", "model.safetensors", "README.md", LABEL_NAMES_FILE} <= set(files), files
        assert not [name for name in files if name.startswith(".haste")], files


def test_cli_push_names_the_login_for_a_refused_token_and_the_hubs_message_otherwise(
    hub, tmp_path, monkeypatch, capsys
):
    """A 401 from the Hub is one line that says how to log in; any other Hub error is the Hub's own message, with
    no word of logging in."""
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError

    from haste_hf.cli import main

    make_model().save_pretrained(tmp_path / "out")
    argv = ["push", "--model", str(tmp_path / "out"), "--repo-id", new_repo_id(hub, "cli-refused")]
    with monkeypatch.context() as patched:
        patched.setenv("HF_TOKEN", "hf_not_a_valid_token")
        assert main(argv) == 1
    error = capsys.readouterr().err
    assert "401 Unauthorized" in error and "hf auth login" in error and hub.url in error

    def forbidden(*args, **kwargs):
        response = httpx2.Response(403, request=httpx2.Request("POST", f"{hub.url}/api/repos/create"))
        raise HfHubHTTPError("403 Forbidden: this namespace is not yours", response=response)

    monkeypatch.setattr(haste_hf.hub, "push_to_hub", forbidden)
    assert main(argv) == 1
    error = capsys.readouterr().err
    assert "this namespace is not yours" in error and "hf auth login" not in error
