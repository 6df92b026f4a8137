# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Configuration of a HASTE extreme multi-label classifier, and the defaults of its structure (G, F, the head's
share, pooling, loss).

Flat and self-contained: it imports only transformers and the standard library, no sibling, so that loading a
HASTE model as remote code (`trust_remote_code=True`, `haste_hf` not installed) fetches this one file before any
of the model's code runs, and transformers notices one downloaded file (`_RepeatedCodeNotice`).
"""

import copy
import difflib
import functools
import inspect
import logging as std_logging
import math
import numbers
import os
import re
from collections.abc import Mapping, Sequence

from transformers import AutoConfig, PretrainedConfig
from transformers.utils import logging


POOLING_MODES = ("cls", "mean", "last_token")
# The paper models the top 2-5% most frequent labels densely ("Head-Tail Split"); every entry point defaults
# to this share.
DEFAULT_HEAD_LABEL_FRACTION = 0.03
# Labels per tail group G and features per group F (the paper: G in {16, 32, 64}, F = 64; `benchmarks/recipe_study.py`:
# F = 128 of MiniLM's 384 features beat 64 on both real datasets, G = 8 did not beat 16).
DEFAULT_GROUP_SIZE = 16
DEFAULT_FAN_IN = 128
LOSS_REDUCTIONS = ("sum", "mean")
# The names of `losses.LOSSES` (read here without importing torch).
LOSSES = ("bce", "squared_hinge")


def head_label_count_for(head_label_fraction: float, label_count: int) -> int:
    """The head size of a share of `label_count` labels, rounded half up (0.03 of 450 labels: 14)."""
    return math.floor(float(head_label_fraction) * label_count + 0.5)


def check_one_of(name: str, value, choices: tuple) -> None:
    """The check the configuration and the output layer share for `pooling`, `loss` and `loss_reduction`."""
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {choices}, got {value!r}.")


class _RepeatedCodeNotice(std_logging.Filter):
    """Drops transformers' notice of downloaded code ("A new version of the following files was downloaded from
    <repository>") where the repository is the one this module was loaded from as remote code and every file listed
    lies beside this module: this file was announced alone, before any code ran; the model's files, fetched next
    from the same repository and revision, would add one notice of 3 to 14 lines for each of its 16 files."""

    NOTICE = "A new version of the following files was downloaded from https://huggingface.co/"

    def __init__(self, folder: str, sanitize):
        super().__init__()
        self.folder, self.sanitize = folder, sanitize

    def filter(self, record: std_logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(self.NOTICE) or ":\n" not in message:
            return True
        repository = message[len(self.NOTICE) : message.index(":\n")]
        files = re.findall(r"^- (.+)$", message, flags=re.MULTILINE)
        here = os.path.dirname(self.folder).endswith(os.sep + os.sep.join(map(self.sanitize, repository.split("/"))))
        return not (here and files and all(os.path.isfile(os.path.join(self.folder, name)) for name in files))


if __name__.startswith("transformers_modules."):  # loaded as remote code: the first of the model's files to run
    from transformers import dynamic_module_utils

    if hasattr(dynamic_module_utils, "_sanitize_module_name"):
        std_logging.getLogger(dynamic_module_utils.__name__).addFilter(
            _RepeatedCodeNotice(os.path.dirname(os.path.abspath(__file__)), dynamic_module_utils._sanitize_module_name)
        )

# Bumped whenever a checkpoint written by this code could not be read correctly by older code.
HASTE_FORMAT_VERSION = 3
# What each format added that older code would misread. A checkpoint is written with the oldest format that
# holds what it uses, so older installs keep reading every checkpoint they can read correctly.
#   2: `normalize` (L2-normalised pooled output, as a SentenceTransformer encoder's Normalize module)
#   3: the output layer's weights under `output_layer.` (`output_layer.head.weight`, ...; formats 1 and 2
#      name them `head.weight`, `tail.supports`, `output_labels`, ..., and still load)

# The shape of the output layer: what a checkpoint must share with the model that resumes it.
OUTPUT_LAYER_STRUCTURE_FIELDS = (
    "label_count",
    "head_label_count",
    "group_size",
    "fan_in",
    "head_projection_dim",
    "tail_projection_dim",
)
# The fields that `from_pretrained(..., field=value)` gives to `__init__` (checked and derived from there) rather than
# setting them on the loaded config; the label maps too, to go with a new `label_count`.
_GIVEN_AT_LOADING = (
    *OUTPUT_LAYER_STRUCTURE_FIELDS,
    "pooling",
    "normalize",
    "classifier_dropout",
    "loss",
    "loss_reduction",
    "tail_bias",
    "eval_top_k",
    "supports_seed",
    "id2label",
    "label2id",
    "problem_type",
)

# `config.json` lists the label names (`id2label` / `label2id`, as transformers' classifiers do: the Hub widget,
# `pipeline` and other tools read them) up to this many labels: 10,000 names of ~30 characters are ~0.6 MB of JSON
# for both maps, still a config file one reads. Beyond, config.json would grow to tens or hundreds of MB (and every
# config built in memory with it), so the names stay in `label_names.json` alone, which always holds the full list.
MAX_CONFIG_LABEL_NAMES = 10_000
PROBLEM_TYPE = "multi_label_classification"
logger = logging.get_logger(__name__)
# Keys `PretrainedConfig` reads beyond its `__init__` parameters and attributes, and others a HASTE config.json holds.
# fmt: off
_TRANSFORMERS_KEYS = (
    "model_type", "custom_pipelines", "auto_map", "torch_dtype", "name_or_path", "num_labels", "output_attentions",
    "attn_implementation", "experts_implementation", "per_layer_config", "rope_scaling", "rope_theta", "use_cache",
)
# fmt: on


@functools.cache
def _known_keys() -> tuple[frozenset, tuple]:
    """(every key a HASTE config.json may hold, HASTE's own fields)."""
    own = tuple(name for name in inspect.signature(HasteConfig.__init__).parameters if name not in ("self", "kwargs"))
    transformers_keys = {*inspect.signature(PretrainedConfig.__init__).parameters, *vars(PretrainedConfig())}
    return frozenset({*transformers_keys, *_TRANSFORMERS_KEYS, *own}), own


def check_unknown_keys(keys) -> None:
    """Refuses a key near one of HASTE's fields (`group_sise`: transformers keeps unknown keys as unused attributes);
    warns of other unknown keys, naming the nearest known one. Transformers' own keys (and private ones) pass."""
    known, own = _known_keys()
    for key in keys:
        if key in known or key.startswith("_"):
            continue
        near = difflib.get_close_matches(key, own, n=1, cutoff=0.75)
        if near:
            raise ValueError(
                f"HasteConfig: `{key}` is not a field; did you mean `{near[0]}`? Fix the key in config.json."
            )
        nearest = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
        logger.warning_once(
            f"HasteConfig: `{key}` is not a field of HASTE or transformers (kept, unused)"
            + (f"; did you mean `{nearest[0]}`?" if nearest else ".")
        )


class LabelNames(Mapping):
    """`id2label` past `MAX_CONFIG_LABEL_NAMES` labels: the name of each label id, from the names a model holds
    (`label_names.json`) or `LABEL_{id}`, for what reads `id2label` (transformers' text-classification pipeline, ...);
    never written to config.json. Read-only: `HasteConfig.set_label_names` replaces it."""

    def __init__(self, label_count: int, names: Sequence[str] | None = None):
        self.label_count = label_count
        # A compact table (`label_names.LabelNameTable`, known by its marker: this module imports no sibling, so that
        # remote code loads it alone) stays one: a tuple would hold a string per label.
        compact = getattr(names, "holds_names_compactly", False)
        self.names = None if names is None else names if compact else tuple(names)

    def __getitem__(self, label_id) -> str:
        if isinstance(label_id, bool) or not isinstance(label_id, numbers.Integral):
            raise KeyError(label_id)
        if not 0 <= label_id < self.label_count:
            raise KeyError(label_id)
        return self.names[label_id] if self.names is not None else f"LABEL_{label_id}"

    def __iter__(self):
        return iter(range(self.label_count))

    def __len__(self) -> int:
        return self.label_count

    def __deepcopy__(self, memo) -> "LabelNames":
        return self  # read-only: `PretrainedConfig.to_dict` deep-copies the config's attributes

    def __repr__(self) -> str:
        return f"LabelNames({self.label_count} labels{', named' if self.names is not None else ''})"


class LabelIds(Mapping):
    """`label2id` beside a `LabelNames`: the id of each name, its table built on first use."""

    def __init__(self, id2label: LabelNames):
        self.id2label = id2label
        self._ids = None

    def _table(self) -> dict[str, int]:
        if self._ids is None:
            self._ids = {name: label_id for label_id, name in self.id2label.items()}
        return self._ids

    def __getitem__(self, name) -> int:
        return self._table()[name]

    def __iter__(self):
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __deepcopy__(self, memo) -> "LabelIds":
        return self

    def __repr__(self) -> str:
        return f"LabelIds({self.id2label!r})"


# Written into every saved config.json: `pipeline("text-classification", model=..., trust_remote_code=True)`
# takes its pipeline class from the code exported with the checkpoint (see pipeline_haste.py).
TEXT_CLASSIFICATION_PIPELINE = {
    "text-classification": {
        "impl": "modeling_haste.HasteTextClassificationPipeline",
        "pt": ["AutoModelForSequenceClassification"],
        "tf": [],
        "type": "text",
    }
}
# The auto classes that load the exported model class: AutoModel, and the one text-classification pipelines use.
MODEL_AUTO_CLASSES = ("AutoModel", "AutoModelForSequenceClassification")

# Decoder-only families score a text from its last token; everything else averages its tokens, which
# is also how sentence-transformers checkpoints (the usual starting point for XMC encoders) were trained.
# fmt: off
_DECODER_MODEL_TYPES = {
    "gpt2", "gpt_neox", "gptj", "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma",
    "gemma2", "gemma3_text", "phi", "phi3", "olmo", "olmo2", "falcon", "opt", "bloom", "smollm3",
}
# fmt: on


def default_pooling(encoder_config: PretrainedConfig) -> str:
    """The pooling a HASTE head uses over `encoder_config`'s token states unless told otherwise."""
    is_decoder = encoder_config.model_type in _DECODER_MODEL_TYPES or getattr(encoder_config, "is_decoder", False)
    return "last_token" if is_decoder else "mean"


class HasteConfig(PretrainedConfig):
    r"""
    Configuration of [`HasteForExtremeClassification`]: an encoder, a dense head over the most frequent
    labels and a group-shared fixed fan-in sparse tail over the rest.

    Output positions are the `head_label_count` head labels, then `tail_group_count * group_size` tail
    slots; the model's `output_labels` buffer maps them to label ids.

    Labels are described as transformers' classifiers describe theirs: `num_labels` is `label_count`,
    `problem_type` is `"multi_label_classification"` (each label scored by its own sigmoid), and `id2label` /
    `label2id` map ids to the label names (`LABEL_{id}` until a model sets them). Up to `MAX_CONFIG_LABEL_NAMES`
    (10,000) labels they are dicts, written to `config.json`; beyond, they are read-only views (`LabelNames`,
    `LabelIds`) over the names the model reads from its `label_names.json`, never written (a million names would
    bloat `config.json`).

    Args:
        encoder (`PretrainedConfig` or `dict`):
            Configuration of the wrapped encoder (any `AutoModel`-loadable architecture).
        label_count (`int`):
            Number of labels L.
        head_label_count (`int`, *optional*):
            Labels served by the dense head (the most frequent ones). `label_count` makes the whole
            output layer dense; 0 removes the head. Defaults to the paper's share,
            `DEFAULT_HEAD_LABEL_FRACTION` (3%) of `label_count`.
        group_size (`int`, *optional*, defaults to 16):
            Labels per tail group G; they share one support of `fan_in` features. 1 gives per-label
            fixed fan-in.
        fan_in (`int`, *optional*, defaults to 128):
            Features F each tail label connects to. At most the tail's input size.
        head_projection_dim / tail_projection_dim (`int`, *optional*):
            Width of the branch's linear projection of the pooled encoder output; `None` feeds the pooled
            output directly.
        pooling (`str`, *optional*):
            `"cls"`, `"mean"` or `"last_token"`. Defaults from the encoder family: `"last_token"` for
            decoder-only models, `"mean"` otherwise.
        normalize (`bool`, *optional*, defaults to `False`):
            L2-normalise the pooled encoder output, as a SentenceTransformer with a Normalize module does.
            `from_encoder_pretrained` and `haste-hf train` leave such a module out (unit-norm features trained
            worse); models saved with it true (before issue 40) keep reading normalised features.
        classifier_dropout (`float`, *optional*, defaults to 0.0):
            Dropout on the pooled encoder output during training.
        loss (`str`, *optional*, defaults to `"bce"`):
            The per-label loss: `"bce"` (binary cross-entropy with logits, the paper's) or `"squared_hinge"`
            (max(0, 1 - s z)^2 with s = +1 for positives, -1 for negatives).
        loss_reduction (`str`, *optional*, defaults to `"sum"`):
            `"sum"`: the loss summed over labels and averaged over the batch (the paper's objective).
            `"mean"`: averaged over labels too.
        tail_bias (`bool`, *optional*, defaults to `False`):
            Whether tail labels have a bias.
        eval_top_k (`int`, *optional*, defaults to 5):
            Labels ranked per example when the model is called with `labels` in eval mode: what a stock
            `transformers.Trainer` evaluating the model receives as predictions (top-k ids, never `[N, L]` logits).
        supports_seed (`int`, *optional*, defaults to 0):
            Seed of the initial random supports.
        format_version (`int`, *optional*):
            Checkpoint format, as read from a checkpoint; a checkpoint newer than this package is refused with an
            upgrade hint. Saving writes `required_format_version`.
    """

    model_type = "haste_xmc"
    sub_configs = {"encoder": AutoConfig}
    # Set when `haste_hf` registers this class (see `custom_pipelines`); a config class loaded as remote code
    # (without the package) keeps False.
    pipeline_is_installed = False

    def __init__(
        self,
        encoder: PretrainedConfig | dict | None = None,
        label_count: int = 1,
        head_label_count: int | None = None,
        group_size: int = DEFAULT_GROUP_SIZE,
        fan_in: int = DEFAULT_FAN_IN,
        head_projection_dim: int | None = None,
        tail_projection_dim: int | None = None,
        pooling: str | None = None,
        normalize: bool = False,
        classifier_dropout: float = 0.0,
        loss: str = "bce",
        loss_reduction: str = "sum",
        tail_bias: bool = False,
        eval_top_k: int = 5,
        supports_seed: int = 0,
        format_version: int = HASTE_FORMAT_VERSION,
        **kwargs,
    ):
        check_unknown_keys(kwargs)
        if isinstance(encoder, dict):
            encoder = dict(encoder)
            if "model_type" not in encoder:
                raise ValueError("`encoder` given as a dict needs a `model_type` key (e.g. 'bert').")
            encoder = AutoConfig.for_model(**encoder)
        elif encoder is None:
            # Only `PretrainedConfig` machinery (e.g. `to_diff_dict` building a default instance) gets here.
            encoder = AutoConfig.for_model("bert")
        self.encoder = encoder
        self.label_count = label_count
        if head_label_count is None and isinstance(label_count, int):
            head_label_count = head_label_count_for(DEFAULT_HEAD_LABEL_FRACTION, label_count)
        self.head_label_count = head_label_count
        self.group_size = group_size
        self.fan_in = fan_in
        self.head_projection_dim = head_projection_dim
        self.tail_projection_dim = tail_projection_dim
        self.pooling = pooling if pooling is not None else default_pooling(encoder)
        self.normalize = normalize
        self.classifier_dropout = classifier_dropout
        self.loss = loss
        self.loss_reduction = loss_reduction
        self.tail_bias = tail_bias
        self.eval_top_k = eval_top_k
        self.supports_seed = supports_seed
        self.format_version = format_version
        # `PretrainedConfig.__init__` pushes its own attention (and experts) implementation, None unless one
        # is asked for, down into every sub-config. The encoder config is the live encoder's own object: left
        # to that, a wrapped pretrained encoder would forget its implementation and attend to padding.
        for name in ("attn_implementation", "experts_implementation"):
            if isinstance(getattr(type(encoder), f"_{name}", None), property):
                kwargs.setdefault(name, {"encoder": getattr(encoder, f"_{name}")})
        kwargs.pop("custom_pipelines", None)  # derived, see `custom_pipelines`
        id2label = self._label_maps(kwargs)
        super().__init__(**kwargs)
        self._set_label_maps(id2label)
        self.validate_haste()

    def _set_label_maps(self, id2label: dict[int, str] | LabelNames | None) -> None:
        if isinstance(id2label, LabelNames):
            # Past the attribute checks of transformers' strict dataclass configs (5.x before 5.24), which take dicts
            # only, and would read the million names one by one.
            self.__dict__.update(id2label=id2label, label2id=LabelIds(id2label))
            return
        self.id2label = id2label
        self.label2id = None if id2label is None else {name: label_id for label_id, name in id2label.items()}

    def _label_maps(self, kwargs) -> dict[int, str] | LabelNames | None:
        """`id2label` for `label_count` labels (the given names when there are as many, else `LABEL_{id}`; a
        `LabelNames` past `MAX_CONFIG_LABEL_NAMES`); takes the label fields out of `kwargs` and checks the ones
        given."""
        num_labels = kwargs.pop("num_labels", None)
        if num_labels is not None and num_labels != self.label_count:
            raise ValueError(
                f"`num_labels` ({num_labels}) differs from `label_count` ({self.label_count}): a HASTE model's "
                "`num_labels` is its label count; set `label_count`."
            )
        problem_type = kwargs.pop("problem_type", None)
        if problem_type not in (None, PROBLEM_TYPE):
            raise ValueError(
                f"`problem_type` of a HASTE model is {PROBLEM_TYPE!r} (labels scored independently), got {problem_type!r}."
            )
        kwargs["problem_type"] = PROBLEM_TYPE
        given = kwargs.pop("id2label", None) or {}
        kwargs.pop("label2id", None)
        # A placeholder (replaced after `PretrainedConfig.__init__`), which would otherwise make up two labels through
        # the `num_labels` setter. Folders saved before the names were written hold such made-up pairs: not `given`.
        kwargs["id2label"] = {0: "LABEL_0"}
        if not isinstance(self.label_count, int):
            return None  # refused by `validate_haste`
        if self.label_count > MAX_CONFIG_LABEL_NAMES:
            return LabelNames(self.label_count)
        if len(given) == self.label_count:
            return {int(label_id): name for label_id, name in given.items()}
        return {label_id: f"LABEL_{label_id}" for label_id in range(self.label_count)}

    @property
    def num_labels(self) -> int:
        return self.label_count

    @num_labels.setter
    def num_labels(self, num_labels: int):
        if num_labels != self.label_count:
            raise ValueError(
                f"`num_labels` of a HASTE model is its `label_count` ({self.label_count}); set `label_count`."
            )

    @property
    def label_names(self) -> list[str] | None:
        """The names in `id2label`, or None where it holds only `LABEL_{id}` placeholders (or nothing); a compact
        table as it is (a list of 10^9 names is 80 GB, and a rank of a sharded run holds its share's names only)."""
        if self.id2label is None:
            return None
        if isinstance(self.id2label, LabelNames):
            names = self.id2label.names
            return None if names is None else names if getattr(names, "holds_names_compactly", False) else list(names)
        names = [self.id2label[label_id] for label_id in range(self.label_count)]
        return None if all(name == f"LABEL_{label_id}" for label_id, name in enumerate(names)) else names

    def set_label_names(self, label_names: list[str] | None):
        """Sets `id2label` / `label2id` to `label_names` (one per label; None: `LABEL_{id}`): dicts up to
        `MAX_CONFIG_LABEL_NAMES` labels, read-only views beyond."""
        if self.label_count > MAX_CONFIG_LABEL_NAMES:
            self._set_label_maps(LabelNames(self.label_count, label_names))
            return
        names = (
            label_names if label_names is not None else [f"LABEL_{label_id}" for label_id in range(self.label_count)]
        )
        self._set_label_maps(dict(enumerate(names)))

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        model_type = config_dict.get("model_type", cls.model_type)
        if model_type != cls.model_type:
            raise ValueError(
                f"This checkpoint holds a {model_type!r} model, not a HASTE one (model_type {cls.model_type!r}): "
                "load it with its own class, or wrap it with `HasteForExtremeClassification.from_encoder_pretrained`."
            )
        return super().from_dict(cls._with_given_fields(config_dict, kwargs), **kwargs)

    @classmethod
    def _with_given_fields(cls, config_dict: dict, kwargs: dict) -> dict:
        """`config_dict` with the HASTE fields given to `from_pretrained` / `from_dict` taken out of `kwargs`, so that
        `__init__` checks and derives from them (transformers would set them on the built config, past the checks).

        `num_labels` is `label_count`, as it re-heads a transformers classifier. A new label count whose head size
        is not given keeps the head's share of the labels; the label names of another label count are dropped."""
        config_dict = dict(config_dict)
        if "num_labels" in kwargs:
            num_labels = kwargs.pop("num_labels")
            if kwargs.setdefault("label_count", num_labels) != num_labels:
                raise ValueError(
                    f"`num_labels` ({num_labels}) and `label_count` ({kwargs['label_count']}) differ: a HASTE model's "
                    "`num_labels` is its label count; give one of them."
                )
        given = {name: kwargs.pop(name) for name in _GIVEN_AT_LOADING if name in kwargs}
        saved_count, saved_head = config_dict.get("label_count"), config_dict.get("head_label_count")
        new_count = given.get("label_count", saved_count)
        counts = (saved_count, saved_head, new_count)
        keeps_share = all(isinstance(count, int) for count in counts) and saved_count > 0
        if new_count != saved_count and "head_label_count" not in given and keeps_share:
            given["head_label_count"] = head_label_count_for(saved_head / saved_count, new_count)
        if new_count != saved_count and "id2label" not in given:
            config_dict.pop("id2label", None)
            config_dict.pop("label2id", None)
        return {**config_dict, **given}

    @property
    def tail_label_count(self) -> int:
        return self.label_count - self.head_label_count

    @property
    def tail_group_count(self) -> int:
        """Number of tail groups K; the last one is padded when G does not divide the tail."""
        return -(-self.tail_label_count // self.group_size)

    @property
    def head_input_dim(self) -> int:
        return self.head_projection_dim or self.encoder.hidden_size

    @property
    def tail_input_dim(self) -> int:
        return self.tail_projection_dim or self.encoder.hidden_size

    def validate_haste(self):
        """Raises a ValueError naming the offending field and the fix for any invalid combination."""

        def positive_int(name, value, allow_none=False):
            if value is None and allow_none:
                return
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"`{name}` must be a positive integer{' or None' if allow_none else ''}, got {value!r}."
                )

        version = self.format_version
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ValueError(
                f"`format_version` must be an integer in [1, {HASTE_FORMAT_VERSION}], got {version!r}: config.json is "
                "damaged; save the model again."
            )
        if self.format_version > HASTE_FORMAT_VERSION:
            raise ValueError(
                f"This checkpoint has `format_version` {self.format_version}, but the installed haste_hf reads "
                f"formats up to {HASTE_FORMAT_VERSION}: upgrade haste_hf (`pip install -U haste_hf`)."
            )
        positive_int("label_count", self.label_count)
        positive_int("group_size", self.group_size)
        positive_int("fan_in", self.fan_in)
        positive_int("eval_top_k", self.eval_top_k)
        positive_int("head_projection_dim", self.head_projection_dim, allow_none=True)
        positive_int("tail_projection_dim", self.tail_projection_dim, allow_none=True)
        if isinstance(self.head_label_count, bool) or not isinstance(self.head_label_count, int):
            raise ValueError(f"`head_label_count` must be an integer, got {self.head_label_count!r}.")
        if not 0 <= self.head_label_count <= self.label_count:
            raise ValueError(
                f"`head_label_count` ({self.head_label_count}) must lie in [0, label_count={self.label_count}]: "
                "lower it, or raise `label_count`."
            )
        if self.tail_label_count and self.fan_in > self.tail_input_dim:
            raise ValueError(
                f"`fan_in` ({self.fan_in}) exceeds the tail's input size ({self.tail_input_dim}): a group cannot "
                "connect to more distinct features than exist. Lower `fan_in` or raise `tail_projection_dim`."
            )
        check_one_of("pooling", self.pooling, POOLING_MODES)
        check_one_of("loss", self.loss, LOSSES)
        check_one_of("loss_reduction", self.loss_reduction, LOSS_REDUCTIONS)
        if not 0.0 <= self.classifier_dropout < 1.0:
            raise ValueError(f"`classifier_dropout` must lie in [0, 1), got {self.classifier_dropout!r}.")

    def get_text_config(self, *args, **kwargs) -> PretrainedConfig:
        # Token-embedding resizing writes `vocab_size` onto the text config: it must land on the encoder's.
        return self.encoder

    @property
    def custom_pipelines(self) -> dict:
        """What `pipeline()` reads: with the package installed, nothing, since transformers reads a config's custom
        pipeline as remote code, refused without `trust_remote_code`; the package names its pipeline in transformers'
        registry instead (`auto_registration.register_pipeline`). Otherwise the HASTE pipeline exported with the
        checkpoint, which needs `trust_remote_code=True`."""
        if self.pipeline_is_installed:
            return {}
        return copy.deepcopy(TEXT_CLASSIFICATION_PIPELINE)  # a copy: `pipeline()` replaces its class names

    @property
    def required_format_version(self) -> int:
        """The oldest checkpoint format that holds this configuration (see `HASTE_FORMAT_VERSION`)."""
        return 3

    def to_dict(self):
        output = super().to_dict()
        output["encoder"] = self.encoder.to_dict()
        output["format_version"] = self.required_format_version
        output["custom_pipelines"] = copy.deepcopy(TEXT_CLASSIFICATION_PIPELINE)
        for name in ("id2label", "label2id"):
            if output.get(name) is None or isinstance(output[name], (LabelNames, LabelIds)):
                output.pop(name, None)  # past `MAX_CONFIG_LABEL_NAMES`, the names are in `label_names.json` only
        auto_map = output.get("auto_map") or {}
        model_class = next((auto_map[name] for name in MODEL_AUTO_CLASSES if name in auto_map), None)
        if model_class is not None:
            # Exporting registers the model for one auto class; every one that loads it must be named.
            output["auto_map"] = {**auto_map, **dict.fromkeys(MODEL_AUTO_CLASSES, model_class)}
        return output


__all__ = [
    "DEFAULT_FAN_IN",
    "DEFAULT_GROUP_SIZE",
    "DEFAULT_HEAD_LABEL_FRACTION",
    "HASTE_FORMAT_VERSION",
    "LOSSES",
    "LOSS_REDUCTIONS",
    "POOLING_MODES",
    "MAX_CONFIG_LABEL_NAMES",
    "MODEL_AUTO_CLASSES",
    "TEXT_CLASSIFICATION_PIPELINE",
    "HasteConfig",
    "LabelIds",
    "LabelNames",
    "check_one_of",
    "default_pooling",
    "head_label_count_for",
]
