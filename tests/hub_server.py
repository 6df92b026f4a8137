"""A small Hugging Face Hub-compatible HTTP server for offline tests (stdlib only).

No installable server accepts Hub uploads, so the push/pull tests talk to this one on 127.0.0.1 with the real
`huggingface_hub` client and transformers. It implements only what those clients call, answering with the JSON
shapes, status codes and headers they check (`tests/test_hub_server.py` pins each endpoint):

Repositories (`{t}` is `models`, `datasets` or `spaces`; `{rev}` a branch, tag or full commit sha, URL-quoted):
    POST   /api/repos/create                    {name, organization, type, visibility|private} -> {url, name, id};
                                                409 (with `url`, which the client reads) when the repo exists.
    POST   /api/validate-yaml                   {content} -> {errors, warnings}; 400 when the front matter is
                                                not a YAML mapping.
    GET    /api/whoami-v2                       the user owning the token.
    GET    /api/{t}/{repo}[/revision/{rev}]     repo info: {id, sha, private, siblings: [{rfilename, size,
                                                blobId}], lastModified, ...}.  HEAD: the same status and headers
                                                (a mirror such as olah asks whether the repo is visible so).
    GET    /api/{t}/{repo}/tree/{rev}[/{path}]  [{type: file|directory, path, size, oid}]; `?recursive=true`.
    POST   /api/{t}/{repo}/paths-info/{rev}     form `paths=...`: entries of the paths that exist.
    GET    /api/{t}/{repo}/refs                 {branches, tags, converts[, pullRequests]}.
    GET    /api/{t}/{repo}/commits/{rev}        [{id, title, message, authors, date}], newest first.
    POST   /api/{t}/{repo}/preupload/{rev}      {files: [{path, size, sample}]} -> every file
                                                `uploadMode: "regular"` (so neither Xet nor LFS is used),
                                                `shouldIgnore: false` and the blob sha of the current file.
    POST   /api/{t}/{repo}/commit/{rev}         NDJSON: `header` {summary, description, parentCommit?}, then
                                                `file` (base64), `deletedFile`, `deletedFolder` lines ->
                                                {success, commitOid, commitUrl}; 412 when `parentCommit` is not
                                                the branch head; `lfsFile` lines are refused (never announced).
    POST   /api/{t}/{repo}/branch/{name}        {startingPoint?} -> new branch (default: from main); 409 if
                                                it exists.  DELETE removes it.
    POST   /api/{t}/{repo}/tag/{rev}            {tag, message?} -> new tag; 409 if it exists.
Files:
    HEAD/GET /[{t}/]{repo}/resolve/{rev}/{path} the file, with `X-Repo-Commit`, `ETag` (git blob sha1),
                                                `Content-Length`; `Range: bytes=a-b` -> 206.

Errors carry `X-Error-Code` (RepoNotFound, RevisionNotFound, EntryNotFound) and `X-Error-Message`, which the
client maps to its exception classes; a 404 on `resolve` also carries `X-Repo-Commit` (transformers probes
optional files that way). Private repos answer 401 RepoNotFound to requests without the server's token, and
every write needs the token. Repository ids always have a namespace; an id without one (a legacy Hub id such as
`gpt2`) is answered RepoNotFound.

Each repository is a bare git repository at `<root>/<t>/<org>/<name>` (created with a first commit holding
`.gitattributes`, as the Hub does), so a read-only mirror such as olah can serve the same folder. Commit
bodies are read one NDJSON line (one file) at a time, each written to git before the next is read, and
downloads are streamed from `git cat-file`: a commit holds about five times its largest file in memory (the
base64 line, its parsed string, the decoded bytes), a download a constant 1 MB. Every request is appended to
`<root>/requests.log` as `METHOD endpoint status` so tests can report which client calls they exercised.

Run standalone: `python tests/hub_server.py --root DIR [--token TOKEN] [--port 0]`; it prints one JSON line
`{"url": ...}` once it listens.
"""

import argparse
import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote


REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
DEFAULT_BRANCH = "main"
NULL_SHA = "0" * 40
_COMMIT_SHA = re.compile(r"[0-9a-f]{40}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_CHUNK = 1 << 20
_INITIAL_GITATTRIBUTES = (
    b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n*.bin filter=lfs diff=lfs merge=lfs -text\n"
)


class HubError(Exception):
    """An error answered to the client, with the Hub's error code header when it has one."""

    def __init__(self, status: int, message: str, code: str | None = None, commit: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.commit = commit


def _check_path(path: str) -> str:
    parts = path.split("/")
    if not path or path.startswith("/") or any(part in ("", ".", "..", ".git") for part in parts):
        raise HubError(400, f"Invalid path in repository: {path!r}")
    return path


class GitRepo:
    """One bare git repository; all git access goes through `git` subprocesses."""

    def __init__(self, path: str):
        self.path = path
        self.lock = threading.Lock()

    def git(self, *args: str, input: bytes | None = None, env: dict | None = None, check: bool = True) -> bytes:
        result = subprocess.run(
            ["git", "-C", self.path, *args],
            input=input,
            capture_output=True,
            env={**_GIT_ENV, **(env or {})},
            check=False,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)} failed: {result.stderr.decode(errors='replace')}")
        return result.stdout

    def succeeds(self, *args: str) -> bool:
        result = subprocess.run(["git", "-C", self.path, *args], capture_output=True, env=_GIT_ENV, check=False)
        return result.returncode == 0

    def config(self, key: str) -> str:
        return self.git("config", "--get", key, check=False).decode().strip()

    @property
    def private(self) -> bool:
        return self.config("hub.private") == "true"

    def resolve(self, revision: str) -> str:
        """Commit sha of a branch, a tag, a full ref (`refs/...`) or a full commit sha."""
        if revision.startswith("-") or not revision:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        if _COMMIT_SHA.fullmatch(revision) or revision.startswith("refs/"):
            candidates = [revision]
        else:
            candidates = [f"refs/heads/{revision}", f"refs/tags/{revision}"]
        for candidate in candidates:
            sha = self.git("rev-parse", "--verify", "-q", f"{candidate}^{{commit}}", check=False).decode().strip()
            if sha:
                return sha
        raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")

    def branch_head(self, branch: str) -> str | None:
        sha = self.git("rev-parse", "--verify", "-q", f"refs/heads/{branch}^{{commit}}", check=False).decode()
        return sha.strip() or None

    def ls_tree(self, commit: str, path: str = "", recursive: bool = False) -> list[dict]:
        """Tree entries under `path` (a folder, or "" for the root); [] when `path` is not a folder."""
        args = ["ls-tree", "-l", "-z"] + (["-r", "-t"] if recursive else []) + [commit]
        if path:
            args += ["--", path.rstrip("/") + "/"]
        entries = []
        for record in self.git(*args).split(b"\0"):
            if not record:
                continue
            meta, name = record.split(b"\t", 1)
            _, kind, oid, size = meta.split()
            entry_path = name.decode()
            if entry_path == path.rstrip("/"):
                continue
            if kind == b"tree":
                entries.append({"type": "directory", "oid": oid.decode(), "size": 0, "path": entry_path})
            elif kind == b"blob":
                entries.append({"type": "file", "oid": oid.decode(), "size": int(size), "path": entry_path})
        return entries

    def entry(self, commit: str, path: str) -> dict | None:
        """The tree entry of exactly `path`, or None."""
        out = self.git("ls-tree", "-l", "-z", commit, "--", path.rstrip("/"))
        for record in out.split(b"\0"):
            if not record:
                continue
            meta, name = record.split(b"\t", 1)
            if name.decode() != path.rstrip("/"):
                continue
            _, kind, oid, size = meta.split()
            if kind == b"tree":
                return {"type": "directory", "oid": oid.decode(), "size": 0, "path": name.decode()}
            return {"type": "file", "oid": oid.decode(), "size": int(size), "path": name.decode()}
        return None

    def write_blob(self, content: bytes) -> str:
        return self.git("hash-object", "-w", "--stdin", input=content).decode().strip()

    def commit(
        self, branch: str, parent: str, message: str, additions: dict, deleted_files: list, deleted_folders: list
    ) -> str:
        """New commit on `branch` from `parent`: `additions` maps paths to blob shas. Caller holds the lock."""
        with tempfile.TemporaryDirectory() as tmp:
            env = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
            self.git("read-tree", parent, env=env)
            present = set(self.git("ls-files", "-z", env=env).decode().split("\0")) - {""}
            removals = []
            for path in deleted_files:
                if path not in present:
                    raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                removals.append(path)
            for folder in deleted_folders:
                prefix = folder.rstrip("/") + "/"
                inside = [path for path in present if path.startswith(prefix)]
                if not inside:
                    raise HubError(404, f"A folder with this name doesn't exist: {folder}", "EntryNotFound")
                removals += inside
            index_info = "".join(f"0 {NULL_SHA}\t{path}\n" for path in removals)
            index_info += "".join(f"100644 {sha}\t{path}\n" for path, sha in additions.items())
            self.git("update-index", "--index-info", input=index_info.encode(), env=env)
            tree = self.git("write-tree", env=env).decode().strip()
        commit = self.git("commit-tree", tree, "-p", parent, input=message.encode()).decode().strip()
        self.git("update-ref", f"refs/heads/{branch}", commit, parent)
        return commit

    def commits(self, commit: str, limit: int = 1000) -> list[dict]:
        out = self.git("log", f"-n{limit}", _DATE_FORMAT, "--format=%H%x00%an%x00%ad%x00%s%x00%b%x1e", commit).decode()
        items = []
        for record in out.split("\x1e"):
            record = record.strip("\n")
            if not record:
                continue
            sha, author, date, title, body = record.split("\0")
            items.append(
                {"id": sha, "title": title, "message": body.strip(), "authors": [{"user": author}], "date": date}
            )
        return items

    def commit_date(self, commit: str) -> str:
        return self.git("log", "-n1", _DATE_FORMAT, "--format=%ad", commit).decode().strip()


# The client parses dates with exactly this pattern.
_DATE_FORMAT = "--date=format-local:%Y-%m-%dT%H:%M:%S.000Z"
_GIT_ENV = {
    **{key: value for key, value in os.environ.items() if not key.startswith("GIT_")},
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "TZ": "UTC",
    "GIT_AUTHOR_NAME": "hub",
    "GIT_AUTHOR_EMAIL": "hub@localhost",
    "GIT_COMMITTER_NAME": "hub",
    "GIT_COMMITTER_EMAIL": "hub@localhost",
}


class HubStore:
    """The repositories under `root`, one bare git repository each."""

    def __init__(self, root: str):
        self.root = root
        self._lock = threading.Lock()
        self._repos: dict[str, GitRepo] = {}

    def path(self, repo_type: str, repo_id: str) -> str:
        return os.path.join(self.root, repo_type + "s", *repo_id.split("/"))

    def get(self, repo_type: str, repo_id: str) -> GitRepo | None:
        key = f"{repo_type}s/{repo_id}"
        with self._lock:
            if key not in self._repos:
                path = self.path(repo_type, repo_id)
                if not os.path.isfile(os.path.join(path, "HEAD")):
                    return None
                self._repos[key] = GitRepo(path)
            return self._repos[key]

    def create(self, repo_type: str, repo_id: str, private: bool) -> GitRepo | None:
        """A new repository with a first commit, or None when it already exists."""
        with self._lock:
            path = self.path(repo_type, repo_id)
            if os.path.exists(path):
                return None
            os.makedirs(os.path.dirname(path), exist_ok=True)
            subprocess.run(["git", "init", "-q", "--bare", "-b", DEFAULT_BRANCH, path], check=True, env=_GIT_ENV)
            repo = GitRepo(path)
            # Stored uncompressed: tests push 100 MB files and never keep the store.
            repo.git("config", "core.looseCompression", "0")
            repo.git("config", "hub.private", "true" if private else "false")
            blob = repo.write_blob(_INITIAL_GITATTRIBUTES)
            tree = repo.git("mktree", input=f"100644 blob {blob}\t.gitattributes\n".encode()).decode().strip()
            commit = repo.git("commit-tree", tree, input=b"initial commit").decode().strip()
            repo.git("update-ref", f"refs/heads/{DEFAULT_BRANCH}", commit)
            self._repos[f"{repo_type}s/{repo_id}"] = repo
            return repo


class HubRequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "HasteTestHub/1.0"

    # ---- plumbing -------------------------------------------------------------------------------------

    def log_message(self, format, *args):
        pass

    def _dispatch(self, method: str):
        self._endpoint = f"unknown {self.path}"
        self._status = 500
        self._body_left = int(self.headers.get("Content-Length") or 0)
        try:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                self.close_connection = True
                raise HubError(411, "Send request bodies with a Content-Length.")
            self._route(method)
        except HubError as error:
            self._drain()
            self._send_error(error)
        except Exception as error:  # noqa: BLE001  (a server bug: answer 500 with the reason so the test shows it)
            self._drain()
            self._send_error(HubError(500, f"{type(error).__name__}: {error}"))
        finally:
            self.server.log_request_line(f"{method} {self._endpoint} {self._status}")

    def do_GET(self):
        self._dispatch("GET")

    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def _drain(self):
        while self._body_left > 0:
            chunk = self.rfile.read(min(_CHUNK, self._body_left))
            if not chunk:
                break
            self._body_left -= len(chunk)

    def _read_body(self) -> bytes:
        data = self.rfile.read(self._body_left)
        self._body_left = 0
        return data

    def _json_body(self) -> dict:
        data = self._read_body()
        try:
            return json.loads(data) if data else {}
        except ValueError:
            raise HubError(400, "Request body is not JSON.") from None

    def _readline(self) -> bytes:
        line = self.rfile.readline(self._body_left)
        self._body_left -= len(line)
        return line

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, content_type="application/json"):
        self._status = status
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(self, payload, status: int = 200, headers: dict | None = None):
        self._send(status, json.dumps(payload).encode(), headers)

    def _send_error(self, error: HubError):
        headers = {"X-Error-Message": error.message}
        if error.code:
            headers["X-Error-Code"] = error.code
        if error.commit:
            headers["X-Repo-Commit"] = error.commit
        self._send_json({"error": error.message}, error.status, headers)

    @property
    def store(self) -> HubStore:
        return self.server.store

    def _authorized(self) -> bool:
        auth = self.headers.get("Authorization", "")
        return auth == f"Bearer {self.server.token}"

    def _require_write(self):
        auth = self.headers.get("Authorization")
        if auth is None:
            raise HubError(401, "You must be authenticated to write.")
        if auth != f"Bearer {self.server.token}":
            raise HubError(401, "Invalid credentials in Authorization header")

    def _repo(self, repo_type: str, repo_id: str) -> GitRepo:
        repo = self.store.get(repo_type, repo_id) if repo_id.count("/") == 1 else None
        if repo is None or (repo.private and not self._authorized()):
            raise HubError(401 if not self._authorized() else 404, "Repository not found", "RepoNotFound")
        return repo

    def _url(self, repo_type: str, repo_id: str) -> str:
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        return f"{self.server.url}/{prefix}{repo_id}"

    # ---- routing --------------------------------------------------------------------------------------

    def _route(self, method: str):
        raw_path, _, raw_query = self.path.partition("?")
        self._query = parse_qs(raw_query)
        parts = [unquote(part) for part in raw_path.split("/")[1:]]
        if parts[:1] == ["api"]:
            return self._route_api(method, parts[1:])
        repo_type = "model"
        if len(parts) >= 6 and parts[0] in REPO_TYPES and parts[3] == "resolve":
            repo_type = REPO_TYPES[parts.pop(0)]
        if len(parts) >= 5 and parts[2] == "resolve" and method in ("GET", "HEAD"):
            self._endpoint = "resolve"
            return self._resolve(repo_type, "/".join(parts[:2]), parts[3], "/".join(parts[4:]))
        if len(parts) >= 4 and parts[1] == "resolve":  # a legacy id without namespace ("gpt2"): none is stored
            self._endpoint = "resolve"
            raise HubError(404, "Repository not found", "RepoNotFound")
        raise HubError(404, f"Not found: {raw_path}")

    def _route_api(self, method: str, parts: list[str]):
        if parts == ["repos", "create"] and method == "POST":
            self._endpoint = "repos/create"
            return self._create_repo()
        if parts == ["validate-yaml"] and method == "POST":
            self._endpoint = "validate-yaml"
            return self._validate_yaml()
        if parts == ["whoami-v2"] and method == "GET":
            self._endpoint = "whoami-v2"
            return self._whoami()
        if len(parts) < 2 or parts[0] not in REPO_TYPES:
            raise HubError(404, f"Not found: /api/{'/'.join(parts)}")
        if len(parts) == 2:  # a legacy id without namespace ("gpt2"): none is stored
            raise HubError(404, "Repository not found", "RepoNotFound")
        repo_type, repo_id, action, rest = REPO_TYPES[parts[0]], "/".join(parts[1:3]), parts[3:4], parts[4:]
        routes = {
            ("GET", ()): self._repo_info,
            ("GET", ("revision",)): self._repo_info,
            ("HEAD", ()): self._repo_info,
            ("HEAD", ("revision",)): self._repo_info,
            ("GET", ("tree",)): self._tree,
            ("POST", ("paths-info",)): self._paths_info,
            ("GET", ("refs",)): self._refs,
            ("GET", ("commits",)): self._commits,
            ("POST", ("preupload",)): self._preupload,
            ("POST", ("commit",)): self._commit,
            ("POST", ("branch",)): self._create_branch,
            ("DELETE", ("branch",)): self._delete_branch,
            ("POST", ("tag",)): self._create_tag,
        }
        handler = routes.get((method, tuple(action)))
        if handler is None:
            self._repo(repo_type, repo_id)  # RepoNotFound first, as the Hub answers
            raise HubError(404, f"Not found: /api/{'/'.join(parts)}")
        self._endpoint = "{t}/{repo}" + "".join(f"/{a}" for a in action)
        return handler(repo_type, repo_id, rest)

    # ---- account and repository creation --------------------------------------------------------------

    def _whoami(self):
        if not self._authorized():
            raise HubError(401, "Invalid credentials in Authorization header")
        user = self.server.user
        self._send_json(
            {
                "type": "user",
                "name": user,
                "fullname": user,
                "orgs": [],
                "auth": {"type": "access_token", "accessToken": {"displayName": "test", "role": "write"}},
            }
        )

    def _create_repo(self):
        self._require_write()
        body = self._json_body()
        name, organization = body.get("name") or "", body.get("organization") or self.server.user
        repo_type = body.get("type") or "model"
        if repo_type not in REPO_TYPES.values():
            raise HubError(400, f"Invalid repo type: {repo_type}")
        if not _NAME.fullmatch(name) or not _NAME.fullmatch(organization) or name.endswith(".git"):
            raise HubError(400, f"Invalid repo name: {organization}/{name}")
        private = body.get("visibility") == "private" or body.get("private") is True
        repo_id = f"{organization}/{name}"
        url = self._url(repo_type, repo_id)
        if self.store.create(repo_type, repo_id, private) is None:
            return self._send_json({"error": "You already created this repo", "url": url}, 409)
        self._send_json({"url": url, "name": repo_id, "id": repo_id})

    def _validate_yaml(self):
        content = self._json_body().get("content", "")
        match = re.match(r"\A---\n(.*?)\n---\n", content, flags=re.DOTALL)
        errors = []
        if match and match.group(1).strip():
            import yaml  # a dependency of huggingface_hub

            try:
                metadata = yaml.safe_load(match.group(1))
            except yaml.YAMLError as error:
                metadata = None
                errors.append({"message": f"Invalid YAML: {error}"})
            if metadata is not None and not isinstance(metadata, dict):
                errors.append({"message": "The metadata block must be a YAML mapping."})
        self._send_json({"errors": errors, "warnings": []}, 400 if errors else 200)

    # ---- reads ----------------------------------------------------------------------------------------

    def _repo_info(self, repo_type, repo_id, rest):
        repo = self._repo(repo_type, repo_id)
        commit = repo.resolve("/".join(rest) or DEFAULT_BRANCH)
        siblings = [
            {"rfilename": entry["path"], "size": entry["size"], "blobId": entry["oid"]}
            for entry in repo.ls_tree(commit, recursive=True)
            if entry["type"] == "file"
        ]
        date = repo.commit_date(commit)
        self._send_json(
            {
                "_id": repo_id,
                "id": repo_id,
                "modelId": repo_id,
                "author": repo_id.split("/")[0],
                "sha": commit,
                "private": repo.private,
                "gated": False,
                "disabled": False,
                "lastModified": date,
                "createdAt": date,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "siblings": siblings,
            }
        )

    def _tree(self, repo_type, repo_id, rest):
        repo = self._repo(repo_type, repo_id)
        if not rest:
            raise HubError(400, "Missing revision.")
        commit = repo.resolve(rest[0])
        path = "/".join(rest[1:]).strip("/")
        recursive = self._query.get("recursive", ["false"])[0].lower() in ("1", "true")
        entries = repo.ls_tree(commit, path, recursive)
        if path and not entries:
            found = repo.entry(commit, path)
            if found is None or found["type"] != "directory":
                raise HubError(404, f'{path} does not exist on "{rest[0]}"', "EntryNotFound")
        self._send_json(entries)

    def _paths_info(self, repo_type, repo_id, rest):
        repo = self._repo(repo_type, repo_id)
        commit = repo.resolve("/".join(rest) or DEFAULT_BRANCH)
        body = self._read_body().decode()
        if self.headers.get("Content-Type", "").startswith("application/json"):
            paths = json.loads(body).get("paths", [])
        else:
            paths = parse_qs(body).get("paths", [])
        entries = [entry for entry in (repo.entry(commit, path) for path in paths) if entry is not None]
        self._send_json(entries)

    def _refs(self, repo_type, repo_id, rest):
        repo = self._repo(repo_type, repo_id)
        refs = {"branches": [], "tags": [], "converts": []}
        if self._query.get("include_prs", ["0"])[0] in ("1", "true"):
            refs["pullRequests"] = []
        groups = {"refs/heads/": "branches", "refs/tags/": "tags", "refs/convert/": "converts"}
        out = repo.git("for-each-ref", "--format=%(refname)%00%(*objectname)%00%(objectname)").decode()
        for line in out.splitlines():
            ref, peeled, target = line.split("\0")
            for prefix, group in groups.items():
                if ref.startswith(prefix):
                    refs[group].append({"name": ref[len(prefix) :], "ref": ref, "targetCommit": peeled or target})
        self._send_json(refs)

    def _commits(self, repo_type, repo_id, rest):
        repo = self._repo(repo_type, repo_id)
        commit = repo.resolve("/".join(rest) or DEFAULT_BRANCH)
        self._send_json(repo.commits(commit))

    def _resolve(self, repo_type, repo_id, revision, path):
        repo = self._repo(repo_type, repo_id)
        commit = repo.resolve(revision)
        entry = repo.entry(commit, path)
        if entry is None or entry["type"] != "file":
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", commit=commit)
        size, start, end = entry["size"], 0, entry["size"] - 1
        status, headers = 200, {"X-Repo-Commit": commit, "ETag": f'"{entry["oid"]}"', "Accept-Ranges": "bytes"}
        range_header = self.headers.get("Range")
        if range_header and size > 0:
            match = re.fullmatch(r"bytes=(\d*)-(\d*)", range_header.strip())
            if match is None or not any(match.groups()):
                raise HubError(416, f"Unsupported Range: {range_header}")
            first, last = match.groups()
            start, end = (size - int(last), size - 1) if not first else (int(first), min(int(last or end), end))
            if start > end or start >= size:
                raise HubError(416, f"Range not satisfiable: {range_header}")
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        self._status = status
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1 if size else 0))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command == "HEAD" or size == 0:
            return
        # Streamed from git: a 100 MB file never sits in memory.
        process = subprocess.Popen(
            ["git", "-C", repo.path, "cat-file", "blob", entry["oid"]], stdout=subprocess.PIPE, env=_GIT_ENV
        )
        try:
            to_skip, to_send = start, end - start + 1
            while to_skip:
                to_skip -= len(process.stdout.read(min(_CHUNK, to_skip)))
            while to_send:
                chunk = process.stdout.read(min(_CHUNK, to_send))
                if not chunk:
                    raise RuntimeError("git cat-file ended early")
                self.wfile.write(chunk)
                to_send -= len(chunk)
        finally:
            process.stdout.close()
            process.kill()
            process.wait()

    # ---- writes ---------------------------------------------------------------------------------------

    def _preupload(self, repo_type, repo_id, rest):
        self._require_write()
        repo = self._repo(repo_type, repo_id)
        commit = repo.resolve("/".join(rest) or DEFAULT_BRANCH)
        files = []
        for item in self._json_body().get("files", []):
            path = _check_path(item["path"])
            entry = repo.entry(commit, path)
            files.append(
                {
                    "path": path,
                    "uploadMode": "regular",
                    "shouldIgnore": False,
                    "oid": entry["oid"] if entry and entry["type"] == "file" else None,
                }
            )
        self._send_json({"files": files, "commitOid": commit})

    def _commit(self, repo_type, repo_id, rest):
        self._require_write()
        repo = self._repo(repo_type, repo_id)
        branch = "/".join(rest) or DEFAULT_BRANCH
        if self._query.get("create_pr", ["0"])[0] in ("1", "true"):
            raise HubError(400, "This test server does not implement pull requests.")
        if branch.startswith("refs/") or _COMMIT_SHA.fullmatch(branch):
            raise HubError(400, f"Commits go to a branch, not to {branch!r}.")
        if repo.branch_head(branch) is None:
            raise HubError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
        header, additions, deleted_files, deleted_folders = None, {}, [], []
        # One NDJSON line at a time: a base64 file line is decoded and written to git before the next is read.
        while self._body_left > 0:
            line = self._readline()
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError:
                raise HubError(400, "Commit body is not NDJSON.") from None
            del line
            key, value = item.get("key"), item.get("value") or {}
            if header is None and key != "header":
                raise HubError(400, "The first NDJSON line must be the commit header.")
            if key == "header":
                header = value
            elif key == "file":
                if value.get("encoding", "base64") != "base64":
                    raise HubError(400, f"Unsupported encoding: {value.get('encoding')}")
                content = base64.b64decode(value.pop("content"))
                additions[_check_path(value["path"])] = repo.write_blob(content)
                del content
            elif key == "deletedFile":
                deleted_files.append(_check_path(value["path"]))
            elif key == "deletedFolder":
                deleted_folders.append(_check_path(value["path"].rstrip("/")))
            else:
                raise HubError(400, f"Unsupported commit operation {key!r}: preupload never asks for LFS.")
        if header is None or not header.get("summary"):
            raise HubError(400, "A commit needs a header line with a summary.")
        message = header["summary"] + (f"\n\n{header['description']}" if header.get("description") else "")
        with repo.lock:
            head = repo.branch_head(branch)
            parent = header.get("parentCommit")
            if parent is not None and parent != head:
                raise HubError(412, f"A commit has happened since {parent}: the head of {branch} is {head}.")
            commit = repo.commit(branch, head, message, additions, deleted_files, deleted_folders)
        self._send_json(
            {
                "success": True,
                "commitOid": commit,
                "commitUrl": f"{self._url(repo_type, repo_id)}/commit/{commit}",
                "hookOutput": "",
            }
        )

    def _create_branch(self, repo_type, repo_id, rest):
        self._require_write()
        repo = self._repo(repo_type, repo_id)
        branch = "/".join(rest)
        if branch.startswith("refs/") or not repo.succeeds("check-ref-format", f"refs/heads/{branch}"):
            raise HubError(400, f"Invalid branch name: {branch!r}")
        start = repo.resolve(self._json_body().get("startingPoint") or DEFAULT_BRANCH)
        with repo.lock:
            if repo.branch_head(branch) is not None:
                raise HubError(409, f"Reference refs/heads/{branch} already exists")
            repo.git("update-ref", f"refs/heads/{branch}", start, NULL_SHA)
        self._send_json({})

    def _delete_branch(self, repo_type, repo_id, rest):
        self._require_write()
        repo = self._repo(repo_type, repo_id)
        branch = "/".join(rest)
        if branch == DEFAULT_BRANCH:
            raise HubError(403, "The default branch cannot be deleted.")
        with repo.lock:
            if repo.branch_head(branch) is None:
                raise HubError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
            repo.git("update-ref", "-d", f"refs/heads/{branch}")
        self._send_json({})

    def _create_tag(self, repo_type, repo_id, rest):
        self._require_write()
        repo = self._repo(repo_type, repo_id)
        commit = repo.resolve("/".join(rest) or DEFAULT_BRANCH)
        body = self._json_body()
        tag = body.get("tag") or ""
        if not repo.succeeds("check-ref-format", f"refs/tags/{tag}"):
            raise HubError(400, f"Invalid tag name: {tag!r}")
        with repo.lock:
            if repo.succeeds("rev-parse", "--verify", "-q", f"refs/tags/{tag}"):
                raise HubError(409, f"Tag {tag} already exists")
            if body.get("message"):
                repo.git("tag", "-a", tag, commit, "-m", body["message"])
            else:
                repo.git("update-ref", f"refs/tags/{tag}", commit, NULL_SHA)
        self._send_json({})


class HubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: str, token: str, user: str = "haste-tester", port: int = 0):
        super().__init__(("127.0.0.1", port), HubRequestHandler)
        os.makedirs(root, exist_ok=True)
        self.store = HubStore(root)
        self.token = token
        self.user = user
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self._log_lock = threading.Lock()
        self._log_path = os.path.join(root, "requests.log")

    def log_request_line(self, line: str):
        with self._log_lock, open(self._log_path, "a") as log:
            log.write(line + "\n")


def start_subprocess(root: str, token: str, user: str = "haste-tester") -> tuple[subprocess.Popen, str]:
    """Run the server in a child process (its memory and GIL stay apart from the tests); returns (process, url)."""
    process = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--root", root, "--token", token, "--user", user],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    if not line:
        raise RuntimeError(f"The test Hub server did not start (exit code {process.wait()}).")
    return process, json.loads(line)["url"]


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True, help="folder holding the repositories")
    parser.add_argument("--token", default="hf_test_token", help="the one token with write access")
    parser.add_argument("--user", default="haste-tester", help="the namespace of repos created without one")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args(argv)
    if shutil.which("git") is None:
        raise SystemExit("The test Hub server stores repositories with git, which is not on PATH.")
    server = HubServer(args.root, args.token, args.user, args.port)
    # Started by `start_subprocess`, the server stops when its parent closes stdin (or dies).
    threading.Thread(target=lambda: (sys.stdin.read(), server.shutdown()), daemon=True).start()
    print(json.dumps({"url": server.url}), flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
