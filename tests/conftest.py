"""Session-wide test setup: a Hub-compatible server on loopback, started before anything imports
`huggingface_hub` or transformers (their module-level clients keep the endpoint they first see).

Every Hub access of the test session goes to this server, with a throwaway token and cache, so tests never
reach the internet and never touch the user's credentials or cache.
"""

import atexit
import os
import shutil
import subprocess
import tempfile

import pytest
import torch
from hub_server import start_subprocess


# Without a GPU the Triton kernels' tests run on CPU tensors through Triton's interpreter, which `triton.jit` picks
# when it decorates a kernel (and `triton.language` its own helpers): set before anything imports triton
# (tests/kernels/triton/conftest.py reads it).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


HUB_TOKEN = "hf_haste_test_token"
HUB_USER = "haste-tester"

_HUB_TMP = tempfile.mkdtemp(prefix="haste-hub-")
HUB_ROOT = os.path.join(_HUB_TMP, "repos")
_hub_process, HUB_URL = start_subprocess(HUB_ROOT, HUB_TOKEN, HUB_USER)

os.environ.update(
    HF_ENDPOINT=HUB_URL,
    HF_TOKEN=HUB_TOKEN,
    HF_HOME=os.path.join(_HUB_TMP, "home"),
    HF_HUB_CACHE=os.path.join(_HUB_TMP, "hub-cache"),
    HF_MODULES_CACHE=os.path.join(_HUB_TMP, "modules"),
    HF_HUB_DISABLE_TELEMETRY="1",
    # Requests can only reach the loopback server, so the client may stay online.
    HF_HUB_OFFLINE="0",
)
os.environ.pop("TRANSFORMERS_OFFLINE", None)


def _stop_hub():
    _hub_process.stdin.close()  # the server shuts down when its stdin closes
    try:
        _hub_process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        _hub_process.kill()
    _hub_process.stdout.close()
    shutil.rmtree(_HUB_TMP, ignore_errors=True)


atexit.register(_stop_hub)


@pytest.fixture(scope="session")
def hub():
    """The test Hub: `url`, `token`, `user` and `root` (its bare git repositories, `<root>/models/<org>/<name>`)."""

    class Hub:
        url, token, user, root = HUB_URL, HUB_TOKEN, HUB_USER, HUB_ROOT

        @staticmethod
        def repo_path(repo_id: str, repo_type: str = "model") -> str:
            return os.path.join(HUB_ROOT, repo_type + "s", *repo_id.split("/"))

        @staticmethod
        def requests() -> list[str]:
            """`METHOD endpoint status` of every request served so far."""
            path = os.path.join(HUB_ROOT, "requests.log")
            return open(path).read().splitlines() if os.path.exists(path) else []

    return Hub


@pytest.fixture
def one_process_group(tmp_path):
    """A one-process gloo group for the whole test (`launch.gloo_group_of_one`)."""
    from launch import gloo_group_of_one

    with gloo_group_of_one(tmp_path):
        yield


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """The tiny encoders' tokenizer (`tiny_encoders.tiny_tokenizer`), saved once a test module."""
    from tiny_encoders import tiny_tokenizer

    return tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """(a tiny random BERT without its pooler, in eval mode; the tokenizer): a bare encoder to embed label texts."""
    from tiny_encoders import tiny_encoder_config, tiny_tokenizer
    from transformers import BertModel

    torch.manual_seed(0)
    model = BertModel(tiny_encoder_config("bert"), add_pooling_layer=False).eval()
    return model, tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def encoder_dir(tmp_path_factory):
    """A saved tiny random BERT encoder with its tokenizer: what the command-line tests train from."""
    from tiny_encoders import tiny_encoder_config, tiny_tokenizer
    from transformers import BertModel

    path = tmp_path_factory.mktemp("encoder")
    BertModel(tiny_encoder_config("bert")).save_pretrained(path)
    tiny_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def dataset_dir(tmp_path_factory):
    """A raw-text JSON-lines dataset (the repository's LF-* format) of 30 planted labels: what the command-line,
    recipe and example tests train on."""
    import gzip
    import json

    from tiny_encoders import planted_texts

    label_count = 30
    path = tmp_path_factory.mktemp("dataset")
    for name, size, seed in (("trn", 160, 0), ("tst", 40, 1)):
        with gzip.open(path / f"{name}.json.gz", "wt") as f:
            for i, row in enumerate(planted_texts(label_count, size, seed=seed)):
                point = {"uid": str(i), "title": row["text"], "content": "", "target_ind": row["labels"]}
                f.write(json.dumps(point) + "\n")
    with gzip.open(path / "lbl.json.gz", "wt") as f:
        for label in range(label_count):
            f.write(json.dumps({"uid": str(label), "title": f"label {label}"}) + "\n")
    return path
