# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Model cards of HASTE models: what was trained, how, and how well, rendered from `model_cards/`."""

import datetime
import importlib.util
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id


if TYPE_CHECKING:  # named in annotations only
    from transformers import PreTrainedModel


PLOT_FILE = "haste_card.png"
_HUB_CACHE_PREFIX = "models--"
METRIC_NAMES = ("P", "nDCG", "PSP", "PSnDCG", "R")
_METRIC_KEY = re.compile(r"^(?:[a-z]+_)?(P|nDCG|PSP|PSnDCG|R)@(\d+)$")


def _template_path() -> Path:
    checkout = Path(__file__).resolve().parent.parent / "model_cards" / "template.md"
    if checkout.exists():
        return checkout
    spec = importlib.util.find_spec("haste_hf._model_cards")
    return Path(next(iter(spec.submodule_search_locations))) / "template.md"


@dataclass
class HasteModelCardData:
    """Everything a HASTE model card states. Build it with `from_model` or `from_trainer` and add what
    only the caller knows (dataset, grouping strategy, label frequencies, test metrics)."""

    model_id: str = "path/to/model"
    encoder: str = "unknown"
    pooling: str = "mean"
    label_count: int = 0
    head_label_count: int = 0
    head_projection_dim: int | None = None
    group_size: int = 1
    fan_in: int = 1
    tail_input_dim: int = 1
    tail_bias: bool = False
    # Whether the head and tail started from the label texts' embeddings (None: not recorded, a trainer-API run).
    label_text_init: bool | None = None
    dataset_name: str | None = None
    dataset_id: str | None = None
    split: str = "test"
    grouping: str | None = None
    rewiring: dict[str, Any] | None = None
    optimizers: list[dict[str, Any]] = field(default_factory=list)
    training: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    propensity: dict[str, float] | None = None
    label_frequencies: np.ndarray | None = None
    license: str = "apache-2.0"
    tags: list[str] = field(default_factory=lambda: ["haste", "extreme-classification", "multi-label"])

    @property
    def tail_label_count(self) -> int:
        return self.label_count - self.head_label_count

    @property
    def sparsity(self) -> float:
        return 1.0 - self.fan_in / self.tail_input_dim

    @classmethod
    def from_model(cls, model: "PreTrainedModel", **fields) -> "HasteModelCardData":
        config = model.config
        defaults = dict(
            encoder=config.encoder.name_or_path or config.encoder.model_type,
            pooling=config.pooling,
            label_count=config.label_count,
            head_label_count=config.head_label_count,
            head_projection_dim=config.head_projection_dim,
            group_size=config.group_size,
            fan_in=config.fan_in,
            tail_input_dim=config.tail_input_dim,
            tail_bias=bool(getattr(config, "tail_bias", False)),
        )
        return cls(**{**defaults, **fields})

    @classmethod
    def from_trainer(cls, trainer, **fields) -> "HasteModelCardData":
        """Model, both optimizers, rewiring and the last evaluation of a `HasteTrainer`; `fields` (and the
        trainer's `model_card_data` dict, if set) override or add to them."""
        args = trainer.args
        optimizers = [
            dict(
                part="Encoder + projections",
                name="AdamW",
                lr=args.learning_rate,
                schedule=getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type),
                warmup=args.warmup_steps,
                other=f"weight decay {args.weight_decay}",
            ),
            dict(
                part="Head + tail",
                name="SGD" + (" (stochastic rounding)" if args.output_stochastic_rounding else ""),
                lr=args.output_learning_rate,
                schedule=args.output_lr_scheduler_type,
                warmup=args.output_warmup_steps,
                other=f"momentum {args.output_momentum} ({args.output_momentum_dtype}), "
                f"decoupled weight decay {args.output_weight_decay}"
                + (
                    f", tail at {scale}x the rate" if (scale := getattr(args, "output_tail_lr_scale", 1.0)) != 1 else ""
                ),
            ),
        ]
        rewiring = None
        rewirings = [
            # The trainer's `RewiringCallback`, known by what the card asks of it: the trainer calls this module,
            # so the card does not import the training code.
            callback
            for callback in trainer.callback_handler.callbacks
            if callable(getattr(callback, "interval_of", None))
        ]
        if rewirings:
            rewiring = dict(
                interval=rewirings[0].interval_of(trainer.state.max_steps),
                fraction=args.rewiring_fraction,
                end=args.rewiring_end_fraction,
                init=args.rewiring_init,
                scope=args.rewiring_scope,
                score=getattr(args, "rewiring_score", "mean_abs"),
            )
        evaluations = [entry for entry in trainer.state.log_history if any(_METRIC_KEY.match(k) for k in entry)]
        training = {
            "steps": trainer.state.global_step,
            "batch size": args.per_device_train_batch_size * args.gradient_accumulation_steps * max(1, args.world_size),
            "precision": "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32",
        }
        model = trainer.accelerator.unwrap_model(trainer.model)
        merged = dict(
            model_id=Path(args.output_dir).name if not args.hub_model_id else args.hub_model_id,
            optimizers=optimizers,
            rewiring=rewiring,
            training=training,
            metrics=evaluations[-1] if evaluations else {},
            split="validation",
        )
        merged.update(getattr(trainer, "model_card_data", None) or {})
        merged.update(fields)
        return cls.from_model(model, **merged)

    def metric_table(self) -> tuple[list[str], list[tuple[int, list[str]]]]:
        """(metric names present, rows of (k, percentages)) from `metrics`, whatever their prefix."""
        values: dict[tuple[str, int], float] = {}
        for key, value in self.metrics.items():
            match = _METRIC_KEY.match(key)
            if match:
                values[match.group(1), int(match.group(2))] = float(value)
        names = [name for name in METRIC_NAMES if any(metric == name for metric, _ in values)]
        ks = sorted({k for _, k in values})
        rows = [(k, [100 * values[name, k] if (name, k) in values else None for name in names]) for k in ks]
        return names, rows

    def metric_table_markdown(self) -> str:
        names, rows = self.metric_table()
        if not rows:
            return ""
        lines = ["| k | " + " | ".join(f"{name}@k" for name in names) + " |", "|---" * (len(names) + 1) + "|"]
        for k, values in rows:
            lines.append(f"| {k} | " + " | ".join("" if v is None else f"{v:.2f}" for v in values) + " |")
        return "\n".join(lines)

    def eval_results(self) -> list[EvalResult]:
        results = []
        for key, value in self.metrics.items():
            match = _METRIC_KEY.match(key)
            if not match:
                continue
            name = f"{match.group(1)}@{match.group(2)}"
            propensity_scored = match.group(1).startswith("PS")
            results.append(
                EvalResult(
                    task_type="text-classification",
                    task_name="Extreme multi-label classification",
                    dataset_type=self.dataset_id or self.dataset_name or "unknown",
                    dataset_name=self.dataset_name or "unknown",
                    dataset_split=self.split,
                    metric_type=name.lower().replace("@", "_at_"),
                    metric_name=name,
                    metric_value=round(100 * float(value), 4),
                    metric_args=self.propensity if propensity_scored and self.propensity else None,
                )
            )
        return results

    def card_data(self) -> ModelCardData:
        return ModelCardData(
            library_name="transformers",
            license=self.license,
            tags=self.tags,
            pipeline_tag="text-classification",
            base_model=hub_model_id(self.encoder),
            # A Hub dataset id only: `dataset_name` may be a local folder's name, which names no Hub dataset.
            datasets=[self.dataset_id] if self.dataset_id else None,
            model_name=self.model_id,
            eval_results=self.eval_results() or None,
        )


def hub_model_id(name_or_path: str | None) -> str | None:
    """The Hub id of the model `name_or_path` names: the id itself, the repository of a folder in the Hub cache
    (`.../models--org--name/snapshots/<sha>`), or None for any other local folder, which names no Hub model."""
    if not name_or_path:
        return None
    path = Path(name_or_path)
    if path.exists():
        cached = [part for part in path.resolve().parts if part.startswith(_HUB_CACHE_PREFIX)]
        return cached[-1][len(_HUB_CACHE_PREFIX) :].replace("--", "/") if cached else None
    try:
        validate_repo_id(str(name_or_path))
    except HFValidationError:
        return None
    return str(name_or_path)


# Ranks drawn of the label-frequency curve, log-spaced (the first and the last among them): on log axes they draw
# the curve of millions of labels as it is, where all of its points would take tens of seconds at every save.
PLOTTED_RANKS = 4096


def plot_card(data: HasteModelCardData, path: str | os.PathLike) -> bool:
    """Label frequencies (sorted, with the head/tail cut) and precision at k, as a PNG. Returns whether
    there was anything to plot."""
    names, rows = data.metric_table()
    has_frequencies = data.label_frequencies is not None and len(data.label_frequencies)
    if not has_frequencies and not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    frequency_axis, metric_axis = axes
    if has_frequencies:
        counts = np.sort(np.asarray(data.label_frequencies))[::-1]
        # A log axis has no 0: labels without training examples are left off (counted in the title), not drawn at 0.5.
        seen = counts[counts > 0]
        ranks = np.arange(1, len(seen) + 1)
        if len(seen) > PLOTTED_RANKS:
            ranks = np.unique(np.geomspace(1, len(seen), PLOTTED_RANKS).round().astype(np.int64))
        frequency_axis.loglog(ranks, seen[ranks - 1], color="tab:blue")
        if data.head_label_count:
            frequency_axis.axvline(
                data.head_label_count,
                color="tab:red",
                linestyle="--",
                label=f"head/tail cut ({data.head_label_count:,})",
            )
            frequency_axis.legend()
        unseen = len(counts) - len(seen)
        title = "Label frequencies" + (f" ({unseen:,} labels without examples not shown)" if unseen else "")
        frequency_axis.set(xlabel="label rank", ylabel="training examples", title=title)
    else:
        frequency_axis.set_axis_off()
    if rows:
        ks = [k for k, _ in rows]
        width = 0.8 / max(1, len(names))
        for index, name in enumerate(names):
            heights = [np.nan if values[index] is None else values[index] for _, values in rows]
            metric_axis.bar(np.array(ks) + (index - (len(names) - 1) / 2) * width, heights, width, label=f"{name}@k")
        metric_axis.set(xlabel="k", ylabel="%", title=f"Metrics ({data.split})", xticks=ks)
        metric_axis.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        metric_axis.set_axis_off()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def render_model_card(data: HasteModelCardData, plot_file: str | None = None) -> ModelCard:
    return ModelCard.from_template(
        data.card_data(),
        template_path=str(_template_path()),
        model_id=data.model_id,
        model_name=data.model_id.split("/")[-1],
        encoder=data.encoder,
        pooling=data.pooling,
        label_count=data.label_count,
        head_label_count=data.head_label_count,
        head_projection_dim=data.head_projection_dim,
        tail_label_count=data.tail_label_count,
        group_size=data.group_size,
        fan_in=data.fan_in,
        tail_input_dim=data.tail_input_dim,
        tail_bias=data.tail_bias,
        label_text_init=data.label_text_init,
        sparsity=data.sparsity,
        dataset_name=data.dataset_name,
        grouping=data.grouping,
        rewiring=data.rewiring,
        optimizers=data.optimizers,
        training=data.training,
        split=data.split,
        propensity=data.propensity,
        metric_table=data.metric_table_markdown(),
        plot_file=plot_file,
    )


def write_model_card(data: HasteModelCardData, path: str | os.PathLike) -> ModelCard:
    """Writes the card to `path` (a README.md) and its plot beside it."""
    directory = Path(path).parent
    directory.mkdir(parents=True, exist_ok=True)
    has_plot = plot_card(data, directory / PLOT_FILE)
    card = render_model_card(data, PLOT_FILE if has_plot else None)
    card.save(path)
    return card


@dataclass
class CardFields:
    """What a run's model card says beyond what its trainer knows. `test_metrics`: None until computed.
    `dataset_id`: the Hub dataset the card's `datasets:` names (the user's `dataset_name`; a local folder's name
    names no Hub dataset)."""

    encoder_name: str
    dataset_name: str
    propensity: Any
    test_metrics: dict | None = None
    hub_model_id: str | None = None
    dataset_id: str | None = None
    label_text_init: bool | None = None


def write_results(folder: Path, trainer, layout, output_dir: str, card: CardFields) -> None:
    """A training run's model card (with the test metrics, when computed) and `test_metrics.json`, written into
    `folder`; `layout`: the run's `LabelLayout`."""
    card_data = HasteModelCardData.from_trainer(
        trainer,
        model_id=card.hub_model_id or Path(output_dir).name,
        encoder=card.encoder_name,
        dataset_name=card.dataset_name,
        dataset_id=card.dataset_id,
        grouping=layout.strategy,
        metrics=card.test_metrics or {},
        split="test",
        propensity={"A": card.propensity.a, "B": card.propensity.b},
        label_text_init=card.label_text_init,
        label_frequencies=layout.label_frequencies.numpy() if layout.label_frequencies is not None else None,
    )
    write_model_card(card_data, folder / "README.md")
    if card.test_metrics is not None:
        (folder / "test_metrics.json").write_text(json.dumps(card.test_metrics, indent=2))


# ------------------------------------------------------------------------------------------------ labels added

ADDED_LABELS_HEADING = "## Labels added"
# Rows of the table of one addition; the rest are named by count (every name is in `label_names.json`).
ADDED_LABELS_LISTED = 50


@dataclass
class LabelAddition:
    """One `add-labels` run, as its card entry states it: the new ids (consecutive), their names (None: unnamed),
    texts, branch ("head" or "tail"), how many example and negative texts fitted them, and when (UTC)."""

    ids: list[int]
    names: list[str] | None
    texts: list[str]
    branch: str
    example_count: int
    negative_count: int
    when: datetime.datetime

    def markdown(self) -> str:
        from . import __version__

        count = len(self.ids)
        if self.negative_count:
            how = (
                f"fitted on each label's text{f' and {self.example_count:,} example texts' if self.example_count else ''}"
                f" against {self.negative_count:,} negative training texts"
            )
        else:
            how = "placed from their texts alone (their scores are not calibrated against the existing labels')"
        lines = [
            f"### {self.when:%Y-%m-%d %H:%M} UTC: {count:,} label{'s' if count > 1 else ''}, ids {self.ids[0]} to "
            f"{self.ids[-1]}, in the {self.branch}",
            "",
            f"Added by `haste-hf add-labels` (haste_hf {__version__}), {how}. The existing labels' scores are "
            "unchanged; metrics above were measured before this addition.",
            "",
            "| id | name | text |",
            "|---|---|---|",
        ]
        for index in range(min(count, ADDED_LABELS_LISTED)):
            name = self.names[index] if self.names is not None else f"LABEL_{self.ids[index]}"
            lines.append(f"| {self.ids[index]} | {_cell(name)} | {_cell(self.texts[index])} |")
        if count > ADDED_LABELS_LISTED:
            lines.append(f"\nand {count - ADDED_LABELS_LISTED:,} more (every name is in `label_names.json`).")
        return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """`text` as one cell of a markdown table: one line, pipes escaped, at most 120 characters."""
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= 120 else text[:119] + "…"


def _renamed_card(card_text: str, model_id: str, label_count: int) -> str:
    """A card rendered from the template (`model_cards/template.md`) for the model it now describes: its usage loads
    `model_id`, not the folder it was copied from (which lacks the added labels), its title and model index name it,
    and its label count is the model's, the trained ones apart. Cards of other makes are left as they are."""
    usage = re.search(r'AutoModel\.from_pretrained\("([^"]+)"\)', card_text)
    if usage is not None and usage.group(1) != model_id:
        old = usage.group(1)
        card_text = card_text.replace(f'from_pretrained("{old}"', f'from_pretrained("{model_id}"')
        card_text = re.sub(rf"^# {re.escape(old.split('/')[-1])}$", f"# {model_id}", card_text, count=1, flags=re.M)
        card_text = re.sub(rf"^- name: {re.escape(old)}$", f"- name: {model_id}", card_text, count=1, flags=re.M)
    labels = re.search(r"^\| Labels \| ([\d,]+)(?: \(([\d,]+) trained[^|]*\))? \|$", card_text, flags=re.M)
    if labels is not None:
        trained = int((labels.group(2) or labels.group(1)).replace(",", ""))
        if label_count != trained:
            row = f"| Labels | {label_count:,} ({trained:,} trained, {label_count - trained:,} added below) |"
            card_text = card_text[: labels.start()] + row + card_text[labels.end() :]
    return card_text


def card_with_added_labels(card_text: str | None, model, model_id: str, addition: LabelAddition) -> str:
    """The model card of `model` after `addition`: `card_text` (the folder's card before, or None: a card rendered
    from the model) with the addition's entry appended under `ADDED_LABELS_HEADING` (one entry per addition)."""
    if card_text is None:
        card_text = str(render_model_card(HasteModelCardData.from_model(model, model_id=model_id)))
    card_text = _renamed_card(card_text, model_id, addition.ids[-1] + 1).rstrip("\n") + "\n"  # the newest ids
    if ADDED_LABELS_HEADING not in card_text:
        card_text += f"\n{ADDED_LABELS_HEADING}\n\nLabels that joined the trained model, newest last.\n"
    return card_text + "\n" + addition.markdown()
