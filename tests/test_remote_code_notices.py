"""A HASTE model loaded from the Hub with remote code (`trust_remote_code=True`, the package not installed) prints
transformers' notice of downloaded code for the configuration's files only, not one block for each of the model's
files."""

import os
import subprocess
import sys
import textwrap
import uuid

from tiny_haste import make_tiny_model

import haste_hf  # noqa: F401  (registers the auto classes)
from haste_hf.hub import push_to_hub


NOTICE = "A new version of the following files was downloaded from"
SCRIPT = """
    import sys
    sys.modules["haste_hf"] = None  # as if the package were not installed
    from transformers import AutoModel

    model = AutoModel.from_pretrained({repo_id!r}, trust_remote_code=True)
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    other = AutoModel.from_pretrained({other_id!r}, trust_remote_code=True)  # another HASTE repository
"""


def load_without_the_package(script: str, tmp_path, hub_cache: str) -> str:
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_CACHE": hub_cache}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr


def test_a_remote_code_load_notices_the_downloaded_code_once_per_repository(hub, tmp_path):
    repo_ids = [f"{hub.user}/notices-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    for repo_id in repo_ids:
        push_to_hub(make_tiny_model(label_count=30, head_label_count=3, training=False), repo_id)
    script = SCRIPT.format(repo_id=repo_ids[0], other_id=repo_ids[1])
    stderr = load_without_the_package(script, tmp_path, str(tmp_path / "hub-cache"))
    notices = stderr.split(NOTICE)[1:]
    # The configuration's files (configuration_haste.py and what it imports), for each repository: they are
    # downloaded before any of the model's code runs. The model's other files add none.
    assert len(notices) <= 4, stderr[-5000:]
    for repo_id in repo_ids:
        assert sum(block.split(":\n", 1)[0].endswith(repo_id) for block in notices) >= 1  # each repository named
    assert "modeling_haste.py" not in stderr
