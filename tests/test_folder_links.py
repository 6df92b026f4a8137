"""A link inside a model or output folder is never followed out of it: a push refuses it (it would publish what it
points to, `~/.ssh/id_rsa` included), and a save replaces a link planted at one of its names instead of writing
through it."""

import os
import uuid
from pathlib import Path

import pytest
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import RepositoryNotFoundError
from tiny_haste import make_tiny_model, make_tiny_trainer

import haste_hf.hub
from haste_hf.hub import push_to_hub
from haste_hf.modeling.saving import INCOMPLETE_SAVE_FILE


SECRET = b"-----BEGIN OPENSSH PRIVATE KEY----- not for the Hub"


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "home" / ".ssh" / "id_rsa"
    path.parent.mkdir(parents=True)
    path.write_bytes(SECRET)
    return path


@pytest.fixture
def saved(tmp_path):
    folder = tmp_path / "model"
    make_tiny_model(12).save_pretrained(folder)
    return folder


def repo_exists(repo_id: str) -> bool:
    try:
        HfApi().model_info(repo_id)
    except RepositoryNotFoundError:
        return False
    return True


@pytest.mark.parametrize("where", ["notes.txt", "docs/notes.txt"])
def test_a_push_refuses_a_file_link_naming_it_and_uploads_nothing(hub, saved, secret, where):
    link = saved / where
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(secret)
    repo_id = f"{hub.user}/links-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ValueError, match=f"{link} is a link .*only regular files") as error:
        push_to_hub(saved, repo_id)
    assert "\n" not in str(error.value)
    assert not repo_exists(repo_id)


def test_a_push_refuses_a_folder_link(hub, saved, secret):
    (saved / "extra").symlink_to(secret.parent, target_is_directory=True)
    with pytest.raises(ValueError, match="extra is a link"):
        push_to_hub(saved, f"{hub.user}/links-{uuid.uuid4().hex[:8]}")


def test_links_in_what_a_push_leaves_out_are_left_out_with_it(hub, saved, secret):
    """Checkpoints, logs and hidden folders are not published: a link inside them publishes nothing either."""
    for folder in ("checkpoint-2", "runs", ".git"):
        (saved / folder).mkdir()
        (saved / folder / "key").symlink_to(secret)
    repo_id = f"{hub.user}/links-{uuid.uuid4().hex[:8]}"
    push_to_hub(saved, repo_id)
    files = HfApi().list_repo_files(repo_id)
    assert "model.safetensors" in files and not [name for name in files if name.endswith("key")]


def test_the_cli_push_refuses_a_link_in_one_line(hub, saved, secret, capsys):
    from haste_hf.cli import main

    (saved / "notes.txt").symlink_to(secret)
    repo_id = f"{hub.user}/links-{uuid.uuid4().hex[:8]}"
    assert main(["push", "--model", str(saved), "--repo-id", repo_id]) == 1
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "notes.txt is a link" in error
    assert not repo_exists(repo_id)


def test_the_trainers_push_of_its_output_dir_refuses_a_link(hub, tmp_path, secret):
    """`Trainer.push_to_hub` uploads `output_dir` as it is: a link there is refused before anything is sent."""
    from datasets import Dataset
    from tiny_encoders import planted_texts, tiny_tokenizer

    output = tmp_path / "run"
    trainer = make_tiny_trainer(
        output, tiny_tokenizer(tmp_path / "tok"), Dataset.from_list(planted_texts(12, 8)), make_tiny_model(12)
    )
    output.mkdir(exist_ok=True)
    (output / "notes.txt").symlink_to(secret)
    repo_id = f"{hub.user}/links-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ValueError, match="notes.txt is a link"):
        trainer.push_to_hub(repo_id=repo_id)
    assert not repo_exists(repo_id)


def test_a_save_replaces_a_link_at_its_marks_name_instead_of_writing_through_it(saved, secret):
    (saved / INCOMPLETE_SAVE_FILE).symlink_to(secret)
    os.remove(saved / "config.json")  # any save: this one restores the folder
    make_tiny_model(12).save_pretrained(saved)
    assert secret.read_bytes() == SECRET
    assert not os.path.lexists(saved / INCOMPLETE_SAVE_FILE) and (saved / "config.json").is_file()


@pytest.mark.parametrize("where", ["notes.txt", "docs/notes.txt"])
def test_a_file_swapped_for_a_link_after_the_push_listed_the_folder_is_not_published(
    hub, saved, secret, monkeypatch, tmp_path, where
):
    """The push lists the folder, then reads it: a file (or the folder holding it) swapped for a link in between is
    refused, not followed."""
    (saved / where).parent.mkdir(exist_ok=True)
    (saved / where).write_text("notes")
    listing = haste_hf.hub.publishable_files

    def list_then_swap(folder, patterns):
        names = listing(folder, patterns)
        if where == "notes.txt":
            (saved / where).unlink()
            (saved / where).symlink_to(secret)
        else:
            (saved / "docs").rename(tmp_path / "docs-moved")
            (secret.parent / "notes.txt").write_bytes(SECRET)
            (saved / "docs").symlink_to(secret.parent, target_is_directory=True)
        return names

    monkeypatch.setattr(haste_hf.hub, "publishable_files", list_then_swap)
    repo_id = f"{hub.user}/links-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ValueError, match="is a link") as error:
        push_to_hub(saved, repo_id)
    assert "\n" not in str(error.value)
    assert not repo_exists(repo_id)


def test_a_push_uploads_the_file_it_opened_even_when_it_is_swapped_for_a_link_after(hub, saved, secret, monkeypatch):
    (saved / "notes.txt").write_text("notes")
    opening = haste_hf.hub.open_published_file

    def open_then_swap(folder, relative):
        file = opening(folder, relative)
        if relative == "notes.txt":
            (saved / relative).unlink()
            (saved / relative).symlink_to(secret)
        return file

    monkeypatch.setattr(haste_hf.hub, "open_published_file", open_then_swap)
    repo_id = f"{hub.user}/links-{uuid.uuid4().hex[:8]}"
    push_to_hub(saved, repo_id)
    assert Path(hf_hub_download(repo_id, "notes.txt")).read_text() == "notes"


@pytest.mark.parametrize("in_place", [True, False])
def test_add_labels_keeps_a_linked_evaluation_settings_file_a_link(hub, tmp_path, secret, capsys, in_place):
    """`add-labels` copied a linked `evaluation_settings.json` into a file holding the link's target, which a push
    then published: the link stays a link, which the push refuses."""
    import json

    from tiny_encoders import tiny_tokenizer

    from haste_hf.cli import main

    folder = tmp_path / "model"
    model = make_tiny_model(12)
    model.set_label_names([f"label {i}" for i in range(12)])
    model.save_pretrained(folder)
    tiny_tokenizer(folder)
    secret.write_text(json.dumps({"private_token": SECRET.decode()}))  # JSON: evaluate reads it, ignoring the key
    (folder / "evaluation_settings.json").symlink_to(secret)
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps([{"name": "new", "text": "w90 w91"}]))
    output = folder if in_place else tmp_path / "added"
    argv = [
        "add-labels",
        "--model",
        str(folder),
        "--labels",
        str(labels),
        "--output-dir",
        str(output),
        "--max-length",
        "16",
    ]
    assert main(argv + ["--overwrite-output-dir"] * in_place) == 0
    settings = output / "evaluation_settings.json"
    assert settings.is_symlink() and os.readlink(settings) == str(secret)
    capsys.readouterr()
    repo_id = f"{hub.user}/links-{uuid.uuid4().hex[:8]}"
    assert main(["push", "--model", str(output), "--repo-id", repo_id]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "evaluation_settings.json is a link" in error[0]
    assert not repo_exists(repo_id)


def test_a_settings_file_is_copied_a_link_kept_a_link_and_anything_else_refused(tmp_path):
    """What `add-labels` does with the model's `evaluation_settings.json` (`copy_keeping_a_link`)."""
    from haste_hf.cli.commands import copy_keeping_a_link

    source, copies = tmp_path / "source", tmp_path / "copies"
    source.mkdir(), copies.mkdir()
    (source / "regular.json").write_text('{"text_fields": "title"}')
    copy_keeping_a_link(source / "regular.json", copies / "regular.json")
    assert (copies / "regular.json").read_text() == '{"text_fields": "title"}'
    assert not (copies / "regular.json").is_symlink()
    (source / "link.json").symlink_to("regular.json")
    copy_keeping_a_link(source / "link.json", copies / "link.json")
    assert os.readlink(copies / "link.json") == "regular.json"
    copy_keeping_a_link(source / "absent.json", copies / "absent.json")
    assert not (copies / "absent.json").exists()
    os.mkfifo(source / "fifo.json")
    with pytest.raises(ValueError, match="fifo.json is not a regular file: remove it, then run the command again"):
        copy_keeping_a_link(source / "fifo.json", copies / "fifo.json")
