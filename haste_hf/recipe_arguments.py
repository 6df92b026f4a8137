# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The options of the training recipe (`recipe.train`) beside `HasteTrainingArguments`, each also a `haste-hf train`
flag, checked before anything loads."""

import os
from dataclasses import dataclass, field
from typing import Literal

from .data import DATA_FORMATS
from .labels.grouping import check_frequency_bands
from .modeling.configuration_haste import DEFAULT_FAN_IN, DEFAULT_GROUP_SIZE, DEFAULT_HEAD_LABEL_FRACTION
from .modeling.defaults import DEFAULT_INIT_FROM_LABEL_TEXTS, DEFAULT_MAX_LENGTH, DEFAULT_TAIL_BIAS
from .modeling.model_sources import DEMO_ENCODER, check_model_source


DEMO_DATASET_NAME = "debian_tags_mini"
DEFAULT_GROUPING = "semantic"
DEFAULT_BETA = 16.0


@dataclass
class RecipeArguments:
    """What the recipe needs besides `HasteTrainingArguments`: data, encoder, output-layer structure, label layout.

    Each field is also a `haste-hf train` flag (`--group-size`, ...); `None` means the default named in its help
    or, for the structure fields, the label layout's value when a layout is given.
    """

    data: str | None = field(
        default=None,
        metadata={
            "help": "Dataset folder in an Extreme Classification Repository "
            "format (raw-text JSON lines, raw text + sparse labels). Default: the embedded demo set."
        },
    )
    encoder: str = field(
        default=DEMO_ENCODER, metadata={"help": "Encoder model id or path ('minilm': the offline MiniLM package)."}
    )
    format: str = field(default="auto", metadata={"help": "Dataset format; 'auto' detects it from the file names."})
    text_fields: Literal["title", "title_content"] | None = field(
        default=None,
        metadata={
            "help": "Text of a JSON-lines "
            "instance: its title, or title + content. Default: title (title_content for the demo set)."
        },
    )
    label_texts: bool = field(default=False, metadata={"help": "Add the labels' own texts as training points."})
    init_from_label_texts: bool = field(
        default=DEFAULT_INIT_FROM_LABEL_TEXTS,
        metadata={
            "help": "Start each label's head row or tail weights from the encoder's embedding of its text (the "
            "dataset's label texts), through the projections and on its group's support, instead of at random. "
            "On by default where the data has label texts; data without them starts at random (said in the log)."
        },
    )
    label_text_init_scale: float = field(
        default=1.0,
        metadata={"help": "With --init-from-label-texts: norm of those rows, relative to the random rows' norm."},
    )
    label_text_grouping_below: int = field(
        default=0,
        metadata={
            "help": "Semantic grouping: labels with fewer training points than this are grouped by their text too "
            "(blended into their embedding with weight 1 - count / this); 0: off."
        },
    )
    validation_fraction: float = field(
        default=0.0,
        metadata={
            "help": "Share of training points held out for model "
            "selection (never the test set); 0: none, all points train (a long tail would lose rare labels to it)."
        },
    )
    dataset_name: str | None = field(
        default=None, metadata={"help": "Name for the model card and propensity presets (default: the folder name)."}
    )
    propensity_a: float | None = field(
        default=None, metadata={"help": "Propensity A for PSP (default: preset by dataset name)."}
    )
    propensity_b: float | None = field(
        default=None, metadata={"help": "Propensity B for PSP (default: preset by dataset name)."}
    )
    max_length: int = field(
        default=DEFAULT_MAX_LENGTH, metadata={"help": "Tokens per text; longer texts are truncated."}
    )
    head_label_fraction: float | None = field(
        default=None,
        metadata={
            "aliases": ["--head-fraction"],
            "help": f"Share of labels (the most frequent) in the dense head (default {DEFAULT_HEAD_LABEL_FRACTION}: the paper "
            "models the top 2-5%% densely).",
        },
    )
    group_size: int | None = field(
        default=None, metadata={"help": f"Labels per tail group G (default {DEFAULT_GROUP_SIZE}; 1: per-label fan-in)."}
    )
    fan_in: int = field(default=DEFAULT_FAN_IN, metadata={"help": "Features F each tail label connects to."})
    head_projection_dim: int | None = field(
        default=None, metadata={"help": "Width of the head's projection (default: none)."}
    )
    tail_projection_dim: int | None = field(
        default=None, metadata={"help": "Width of the tail's projection (default: none)."}
    )
    tail_bias: bool = field(
        default=DEFAULT_TAIL_BIAS,
        metadata={
            "help": "Give every tail label a bias, as the dense head's labels have: a rare label's logit can then "
            "learn its low prior instead of ranking as a false positive."
        },
    )
    pooling: Literal["cls", "mean", "last_token"] | None = field(
        default=None,
        metadata={
            "help": "Pooling of the encoder's token states (default: a SentenceTransformer's own, else by encoder family)."
        },
    )
    grouping: Literal["semantic", "frequency", "random"] | None = field(
        default=None,
        metadata={
            "help": "How tail labels "
            "are grouped: by label embeddings (semantic, the paper; the default), by frequency, or at random."
        },
    )
    beta: float | None = field(
        default=None,
        metadata={"help": f"Semantic grouping: k-means buckets hold about beta groups (default {DEFAULT_BETA})."},
    )
    frequency_bands: list[int] | None = field(
        default=None,
        metadata={
            "help": "Group each tail label only with labels of its band of training counts, given by the bands' upper "
            "bounds (e.g. 1 5: labels seen once, 2-5 times, more often), so that rare labels do not share a support "
            "chosen for frequent ones; each band holds whole groups (its few most frequent labels move up a band). "
            "Default: one pool."
        },
    )
    layout_file: str | None = field(
        default=None,
        metadata={
            "aliases": ["--grouping-file"],
            "help": "A label layout saved "
            "by `haste-hf group` with the same data, --validation-fraction and --seed (skips the head/tail split and the "
            "grouping).",
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Replace the model and checkpoints already in "
            "the output folder; without it (or --resume-from-checkpoint) such a folder is refused."
        },
    )

    def __post_init__(self):
        """Refuses values that would fail deep in the run (or after it), naming the field: checked before
        anything loads."""
        if self.data is not None and not os.path.isdir(self.data):
            raise ValueError(
                f"`data`: no folder {self.data!r}" + (" (it is a file)" if os.path.isfile(self.data) else "") + "."
            )
        check_model_source(self.encoder, "encoder")
        if self.layout_file is not None and not os.path.isfile(self.layout_file):
            raise ValueError(f"`layout_file`: no file {self.layout_file!r}.")
        if self.format not in DATA_FORMATS:
            raise ValueError(f"`format` must be one of {DATA_FORMATS}, got {self.format!r}.")
        if not 0 <= self.validation_fraction < 1:
            raise ValueError(
                f"`validation_fraction` must lie in [0, 1) (0: no validation split), got {self.validation_fraction}."
            )
        if self.head_label_fraction is not None and not 0 <= self.head_label_fraction <= 1:
            raise ValueError(f"`head_label_fraction` must lie in [0, 1], got {self.head_label_fraction}.")
        for name in ("max_length", "group_size", "fan_in", "head_projection_dim", "tail_projection_dim"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"`{name}` must be >= 1, got {value}.")
        if not self.label_text_init_scale > 0:
            raise ValueError(f"`label_text_init_scale` must be > 0, got {self.label_text_init_scale}.")
        if self.label_text_grouping_below < 0:
            raise ValueError(
                f"`label_text_grouping_below` must be >= 0 (0: off), got {self.label_text_grouping_below}."
            )
        if self.frequency_bands is not None:
            check_frequency_bands(self.frequency_bands)
        if self.beta is not None and not self.beta >= 1:
            raise ValueError(f"`beta` (average bucket size in groups) must be >= 1, got {self.beta}.")
        for name in ("propensity_a", "propensity_b"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(f"`{name}` must be > 0, got {getattr(self, name)}.")


__all__ = ["DEFAULT_BETA", "DEFAULT_GROUPING", "DEMO_DATASET_NAME", "RecipeArguments"]


def label_texts_for(dataset, data, **options) -> list[str] | None:
    """The label texts of `dataset` (read from the folder `data`, None for the demo set) when one of the recipe
    `options` given (name: value) is on, else None; a `ValueError` naming the option when the dataset has none."""
    reading = [name for name, value in options.items() if value]
    if reading and dataset.label_texts is None:
        flag = "--" + reading[0].replace("_", "-")
        raise ValueError(
            f"`{reading[0]}` ({flag}) reads each label's text, and {data or DEMO_DATASET_NAME} has none (no "
            "lbl.json.gz or Y.txt): use the dataset's raw-text release, or leave the option out."
        )
    return dataset.label_texts if reading else None


def label_text_share(recipe: RecipeArguments, training_args):
    """Of the label count, the ids whose label texts this process reads (`load_xmc_dataset`'s `label_text_share`):
    in a label-sharded run of more labels than config.json names (`MAX_CONFIG_LABEL_NAMES`), where no option reads
    every label's text (label points, label-text init, grouping by label texts), the range of the names its rank
    saves (`balanced_ranges`, as `save_sharded_folder` writes them); else None, every text."""
    from .evaluation import process_rank_and_count
    from .modeling.configuration_haste import MAX_CONFIG_LABEL_NAMES
    from .training.distributed import balanced_ranges
    from .training.sharded_output_layer import resolve_shard_output_layer

    reads_all = recipe.label_texts or recipe.init_from_label_texts or recipe.label_text_grouping_below
    if reads_all or not resolve_shard_output_layer(training_args.shard_output_layer, training_args.world_size):
        return None
    rank, world_size = process_rank_and_count()
    return lambda count: balanced_ranges(count, world_size)[rank] if count > MAX_CONFIG_LABEL_NAMES else None
