"""Pins the test Hub server (`tests/hub_server.py`) endpoint by endpoint with the real `huggingface_hub`
client: what the client sends, what it needs back, and the errors it maps from status codes and headers."""

import base64
import hashlib
import json
import subprocess
import uuid
from pathlib import Path

import httpx2
import pytest
from huggingface_hub import (
    CommitOperationAdd,
    HfApi,
    get_hf_file_metadata,
    hf_hub_download,
    hf_hub_url,
    snapshot_download,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile, RepoFolder


@pytest.fixture
def api():
    return HfApi()


@pytest.fixture
def repo_id(api, hub):
    """A fresh repository holding `a.txt`, `sub/b.bin` and `README.md` on main."""
    repo_id = f"{hub.user}/pin-{uuid.uuid4().hex[:8]}"
    api.create_repo(repo_id)
    api.create_commit(
        repo_id,
        [
            CommitOperationAdd("a.txt", b"alpha"),
            CommitOperationAdd("sub/b.bin", bytes(range(256)) * 4),
            CommitOperationAdd("README.md", b"---\nlicense: mit\n---\n# Card\n"),
        ],
        commit_message="Add files",
        commit_description="Three files.",
    )
    return repo_id


def git_blob_sha(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def raw(method, url, **kwargs):
    """One HTTP request outside the client, to check what the client does not surface."""
    with httpx2.Client() as client:
        return client.request(method, url, **kwargs)


def auth(hub):
    return {"Authorization": f"Bearer {hub.token}"}


# ---- POST /api/repos/create ---------------------------------------------------------------------


def test_create_repo_namespaces_conflicts_and_visibility(api, hub):
    name = f"create-{uuid.uuid4().hex[:8]}"
    url = api.create_repo(name)  # no namespace: the token's user
    assert url.repo_id == f"{hub.user}/{name}" and url == f"{hub.url}/{hub.user}/{name}"
    with pytest.raises(HfHubHTTPError) as error:
        api.create_repo(f"{hub.user}/{name}")
    assert error.value.response.status_code == 409
    # exist_ok=True reads the repo URL from the body of the 409.
    assert api.create_repo(f"{hub.user}/{name}", exist_ok=True).repo_id == f"{hub.user}/{name}"

    private_id = f"some-org/{name}"
    api.create_repo(private_id, private=True)
    assert api.model_info(private_id).private is True and api.model_info(f"{hub.user}/{name}").private is False
    # Without the token a private repo does not exist (401 RepoNotFound, as on the Hub); public ones do.
    with pytest.raises(RepositoryNotFoundError):
        api.model_info(private_id, token=False)
    assert api.model_info(f"{hub.user}/{name}", token=False).sha
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download(private_id, ".gitattributes", token=False)


def test_writes_need_the_token(api, hub):
    with pytest.raises(HfHubHTTPError) as error:
        api.create_repo(f"{hub.user}/denied", token=False)
    assert error.value.response.status_code == 401
    response = raw("POST", f"{hub.url}/api/repos/create", json={"name": "x"}, headers={"Authorization": "Bearer nope"})
    assert (
        response.status_code == 401
        and response.headers["X-Error-Message"] == "Invalid credentials in Authorization header"
    )
    assert api.whoami()["name"] == hub.user


def test_new_repo_has_an_initial_commit_like_the_hub(api, hub):
    repo_id = api.create_repo(f"{hub.user}/fresh-{uuid.uuid4().hex[:8]}").repo_id
    assert api.list_repo_files(repo_id) == [".gitattributes"]
    commits = api.list_repo_commits(repo_id)
    assert [commit.title for commit in commits] == ["initial commit"]


# ---- preupload, NDJSON commit, validate-yaml -----------------------------------------------------


def test_preupload_asks_for_regular_uploads_with_the_current_blob_sha(repo_id, hub):
    files = [
        {"path": "a.txt", "size": 5, "sample": base64.b64encode(b"alpha").decode()},
        {"path": "model.safetensors", "size": 300 << 20, "sample": ""},
    ]
    response = raw("POST", f"{hub.url}/api/models/{repo_id}/preupload/main", json={"files": files}, headers=auth(hub))
    assert response.status_code == 200
    answer = {item["path"]: item for item in response.json()["files"]}
    # Large files too: "lfs" would send them through Xet (hf_xet) or the LFS batch API, which this server lacks.
    assert {item["uploadMode"] for item in answer.values()} == {"regular"}
    assert not any(item["shouldIgnore"] for item in answer.values())
    assert answer["a.txt"]["oid"] == git_blob_sha(b"alpha") and answer["model.safetensors"]["oid"] is None


def test_commit_messages_descriptions_and_skipped_unchanged_files(api, repo_id):
    commits = api.list_repo_commits(repo_id)
    assert [commit.title for commit in commits] == ["Add files", "initial commit"]
    assert commits[0].message == "Three files."
    # The client compares the preupload oid with its own blob sha and sends nothing for an unchanged file.
    info = api.upload_file(path_or_fileobj=b"alpha", path_in_repo="a.txt", repo_id=repo_id, commit_message="Same")
    assert info.oid == commits[0].commit_id
    info = api.upload_file(path_or_fileobj=b"beta", path_in_repo="a.txt", repo_id=repo_id, commit_message="Change a")
    assert api.list_repo_commits(repo_id)[0].commit_id == info.oid != commits[0].commit_id
    assert info.commit_url.endswith(f"/{repo_id}/commit/{info.oid}")


def test_upload_folder_delete_file_and_folder(api, repo_id, tmp_path):
    (tmp_path / "nested" / "deep").mkdir(parents=True)
    (tmp_path / "nested" / "deep" / "c.json").write_text("{}")
    (tmp_path / "top.txt").write_text("top")
    api.upload_folder(folder_path=tmp_path, repo_id=repo_id, path_in_repo="folder", commit_message="Folder")
    assert {"folder/top.txt", "folder/nested/deep/c.json"} <= set(api.list_repo_files(repo_id))
    api.delete_folder("folder/nested", repo_id)
    api.delete_file("a.txt", repo_id)
    assert sorted(api.list_repo_files(repo_id)) == [".gitattributes", "README.md", "folder/top.txt", "sub/b.bin"]
    with pytest.raises(EntryNotFoundError, match="doesn't exist"):
        api.delete_file("a.txt", repo_id)


def test_commit_with_a_stale_parent_is_refused(api, repo_id):
    parent = api.list_repo_commits(repo_id)[1].commit_id
    with pytest.raises(HfHubHTTPError) as error:
        api.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id=repo_id, parent_commit=parent)
    assert error.value.response.status_code == 412


def test_readme_front_matter_is_validated(api, repo_id):
    with pytest.raises(ValueError, match="Invalid YAML"):
        api.upload_file(path_or_fileobj=b"---\nlicense: [mit\n---\n", path_in_repo="README.md", repo_id=repo_id)
    api.upload_file(path_or_fileobj=b"---\nlicense: apache-2.0\n---\nText\n", path_in_repo="README.md", repo_id=repo_id)


def test_commits_are_plain_git_commits_on_disk(api, repo_id, hub):
    def git(*args):
        return subprocess.run(["git", "-C", hub.repo_path(repo_id), *args], capture_output=True, check=True).stdout

    head = api.model_info(repo_id).sha
    assert git("rev-parse", "refs/heads/main").decode().strip() == head
    assert git("show", f"{head}:a.txt") == b"alpha"
    assert git("log", "-1", "--format=%B", head).decode().strip() == "Add files\n\nThree files."


# ---- branches, tags, refs, revisions -----------------------------------------------------------


def test_branches_tags_and_revisions(api, repo_id):
    main_sha = api.model_info(repo_id).sha
    api.create_branch(repo_id, branch="dev/next")
    with pytest.raises(HfHubHTTPError) as error:
        api.create_branch(repo_id, branch="dev/next")
    assert error.value.response.status_code == 409
    api.create_branch(repo_id, branch="dev/next", exist_ok=True)
    dev_sha = api.upload_file(path_or_fileobj=b"dev", path_in_repo="a.txt", repo_id=repo_id, revision="dev/next").oid
    api.create_tag(repo_id, tag="v1", revision=dev_sha)
    api.create_branch(repo_id, branch="from-old", revision=main_sha)

    refs = api.list_repo_refs(repo_id)
    assert {ref.name: ref.target_commit for ref in refs.branches} == {
        "main": main_sha,
        "dev/next": dev_sha,
        "from-old": main_sha,
    }
    assert [(tag.name, tag.ref, tag.target_commit) for tag in refs.tags] == [("v1", "refs/tags/v1", dev_sha)]
    for revision, content in [
        ("main", b"alpha"),
        ("dev/next", b"dev"),
        ("v1", b"dev"),
        (main_sha, b"alpha"),
        (dev_sha, b"dev"),
    ]:
        assert Path(hf_hub_download(repo_id, "a.txt", revision=revision)).read_bytes() == content
        assert api.model_info(repo_id, revision=revision).sha in (main_sha, dev_sha)
    api.delete_branch(repo_id, branch="from-old")
    assert {ref.name for ref in api.list_repo_refs(repo_id).branches} == {"main", "dev/next"}
    assert api.revision_exists(repo_id, "dev/next") and not api.revision_exists(repo_id, "nope")


def test_commit_to_a_missing_branch_is_refused(api, repo_id):
    with pytest.raises(RevisionNotFoundError):
        api.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id=repo_id, revision="no-such-branch")


# ---- repo info, tree, paths-info ---------------------------------------------------------------


def test_repo_info_siblings(api, repo_id, hub):
    info = api.model_info(repo_id, files_metadata=True)
    siblings = {sibling.rfilename: sibling for sibling in info.siblings}
    assert set(siblings) == {".gitattributes", "a.txt", "sub/b.bin", "README.md"}
    assert siblings["sub/b.bin"].size == 1024 and siblings["a.txt"].blob_id == git_blob_sha(b"alpha")
    assert info.id == repo_id and len(info.sha) == 40 and info.last_modified is not None
    assert api.repo_exists(repo_id) and not api.repo_exists(f"{repo_id}-missing")
    # HEAD, as a mirror checks visibility: the GET's status and headers, no body.
    for path in ("", "/revision/main"):
        head = raw("HEAD", f"{hub.url}/api/models/{repo_id}{path}")
        assert head.status_code == 200 and head.content == b"", path
    assert raw("HEAD", f"{hub.url}/api/models/{repo_id}-missing").headers["X-Error-Code"] == "RepoNotFound"


def test_tree_and_paths_info(api, repo_id):
    top = {entry.path: entry for entry in api.list_repo_tree(repo_id)}
    assert isinstance(top["sub"], RepoFolder) and isinstance(top["a.txt"], RepoFile) and top["a.txt"].size == 5
    assert [entry.path for entry in api.list_repo_tree(repo_id, path_in_repo="sub")] == ["sub/b.bin"]
    recursive = {entry.path for entry in api.list_repo_tree(repo_id, recursive=True)}
    assert recursive == {".gitattributes", "README.md", "a.txt", "sub", "sub/b.bin"}
    with pytest.raises(EntryNotFoundError):
        list(api.list_repo_tree(repo_id, path_in_repo="missing"))
    infos = {entry.path: entry for entry in api.get_paths_info(repo_id, ["a.txt", "sub", "missing.txt"])}
    assert set(infos) == {"a.txt", "sub"} and infos["a.txt"].blob_id == git_blob_sha(b"alpha")
    assert isinstance(infos["sub"], RepoFolder)
    assert api.file_exists(repo_id, "sub/b.bin") and not api.file_exists(repo_id, "sub/c.bin")


# ---- resolve -----------------------------------------------------------------------------------


def test_resolve_headers_and_ranges(api, repo_id, hub):
    sha = api.model_info(repo_id).sha
    metadata = get_hf_file_metadata(hf_hub_url(repo_id, "sub/b.bin"))
    assert metadata.commit_hash == sha and metadata.size == 1024
    assert metadata.etag == git_blob_sha(bytes(range(256)) * 4)
    response = raw("GET", hf_hub_url(repo_id, "sub/b.bin"), headers={"Range": "bytes=10-19"})
    assert response.status_code == 206 and response.content == (bytes(range(256)) * 4)[10:20]
    assert response.headers["Content-Range"] == "bytes 10-19/1024"
    assert raw("GET", hf_hub_url(repo_id, "sub/b.bin"), headers={"Range": "bytes=-4"}).content == bytes(
        [252, 253, 254, 255]
    )
    # A missing file still names the commit: transformers probes optional files this way.
    response = raw("HEAD", hf_hub_url(repo_id, "added_tokens.json"))
    assert response.status_code == 404 and response.headers["X-Error-Code"] == "EntryNotFound"
    assert response.headers["X-Repo-Commit"] == sha


def test_downloads(api, repo_id):
    path = snapshot_download(repo_id)
    assert Path(f"{path}/sub/b.bin").read_bytes() == bytes(range(256)) * 4
    first = api.model_info(repo_id).sha
    api.upload_file(path_or_fileobj=b"second", path_in_repo="a.txt", repo_id=repo_id)
    assert Path(f"{snapshot_download(repo_id, revision=first)}/a.txt").read_bytes() == b"alpha"
    assert Path(f"{snapshot_download(repo_id)}/a.txt").read_bytes() == b"second"


# ---- errors --------------------------------------------------------------------------------------


def test_errors_map_to_the_client_exceptions(api, repo_id, hub):
    with pytest.raises(RepositoryNotFoundError):
        api.model_info(f"{hub.user}/does-not-exist")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download(f"{hub.user}/does-not-exist", "config.json")
    # Ids without a namespace (legacy Hub models such as "gpt2") are never stored.
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("gpt2", "config.json")
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("gpt2")
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("gpt2", revision="main")
    with pytest.raises(RevisionNotFoundError):
        api.model_info(repo_id, revision="no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(repo_id, "a.txt", revision="0" * 40)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(repo_id, "missing.txt")
    response = raw("GET", f"{hub.url}/api/models/{repo_id}/revision/nope")
    assert response.status_code == 404 and response.headers["X-Error-Code"] == "RevisionNotFound"
    assert json.loads(response.content)["error"].startswith("Invalid rev id")


def test_request_log_names_the_endpoints(api, repo_id, hub):
    api.list_repo_refs(repo_id)
    log = hub.requests()
    assert "POST {t}/{repo}/commit 200" in log and "GET {t}/{repo}/refs 200" in log


def test_dataset_repositories(api, hub):
    repo_id = api.create_repo(f"{hub.user}/data-{uuid.uuid4().hex[:8]}", repo_type="dataset").repo_id
    api.upload_file(path_or_fileobj=b"x,y\n", path_in_repo="data/train.csv", repo_id=repo_id, repo_type="dataset")
    assert api.list_repo_files(repo_id, repo_type="dataset") == [".gitattributes", "data/train.csv"]
    assert Path(hf_hub_download(repo_id, "data/train.csv", repo_type="dataset")).read_bytes() == b"x,y\n"
    assert not api.repo_exists(repo_id)  # a model repo of that name does not exist
    assert hub.repo_path(repo_id, "dataset").endswith(f"datasets/{repo_id}")
