# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""`haste-hf`: train, evaluate, predict, group and publish HASTE models from the command line.

    haste-hf demo                                   # the embedded dataset, the offline MiniLM encoder
    haste-hf train --data DIR --encoder NAME --output-dir OUT
    haste-hf evaluate --model OUT --data DIR
    haste-hf predict --model OUT --input texts.txt --output predictions.jsonl
    haste-hf group --data DIR --encoder NAME --output layout.safetensors   # then train --layout-file
    haste-hf push --model OUT --repo-id user/name
    haste-hf export --model OUT --format onnx --output OUT-onnx              # serve with onnxruntime

Nothing heavy loads before the arguments are checked: `--help`, `--version`, each command's `--help` and its usage
errors answer without torch or transformers (this module imports neither, nor does `import haste_hf`). The flags of
`train`, `demo` and `group`, fields of dataclasses that need transformers, are checked against their snapshot
(`flags.py`); the dataclasses load once the arguments check out.
"""

import functools
import json
import os
import sys
from pathlib import Path

from ..modeling.defaults import DEFAULT_EVAL_BATCH_SIZE, DEFAULT_MAX_LENGTH
from .errors import DEBUG_VARIABLE, UsageError, is_model_file_error, one_line, report
from .parser import check_report_to, parse_args


SUMMARY_METRICS = ("P", "PSP", "nDCG")


def default_device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def launched_processes() -> int:
    """The processes torchrun (or accelerate launch) started this one among: 1 when run alone."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def join_process_group():
    """Under torchrun: joins the process group (NCCL on GPUs, gloo on CPUs) and returns this rank's device."""
    import torch
    import torch.distributed as dist

    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device


def is_main_process() -> bool:
    from ..evaluation import process_rank_and_count

    return process_rank_and_count()[0] == 0


def load_data(args, label_text_share=None):
    from ..recipe import load_dataset

    label_texts = getattr(args, "label_texts", False)
    return load_dataset(args.data, args.format, args.text_fields, label_texts, label_text_share)


def propensity_for(args, data):
    from ..recipe import dataset_name_of, propensity_of

    return propensity_of(data, dataset_name_of(args.data, args.dataset_name), args.propensity_a, args.propensity_b)


def format_summary(title: str, metrics: dict, extra: dict | None = None) -> str:
    """A fixed-width table: one row per metric family, one column per k, then extra lines."""
    from ..metrics import DEFAULT_KS

    width = 10
    lines = [title, "-" * (8 + width * len(DEFAULT_KS))]
    lines.append(f"{'':8}" + "".join(f"{'@' + str(k):>{width}}" for k in DEFAULT_KS))
    for name in SUMMARY_METRICS:
        values = [metrics.get(f"{name}@{k}") for k in DEFAULT_KS]
        if any(value is not None for value in values):
            lines.append(f"{name:8}" + "".join(f"{'' if v is None else f'{100 * v:.2f}':>{width}}" for v in values))
    lines.append("-" * (8 + width * len(DEFAULT_KS)))
    for key, value in (extra or {}).items():
        lines.append(f"{key}: {value}")
    return "\n".join(lines)


def evaluate_split(model, tokenizer, data, split, args, propensity):
    from ..evaluation import evaluate_split

    return evaluate_split(
        model, tokenizer, data, split, propensity, batch_size=args.eval_batch_size, max_length=args.max_length
    )


def command_train(args) -> int:
    from ..evaluation import process_rank_and_count
    from ..recipe import train
    from ..training.run_folder import RunFolder

    training = args.training
    check_report_to(training.report_to)
    try:
        RunFolder(
            training.output_dir,
            overwrite=args.recipe.overwrite_output_dir,
            resume=bool(training.resume_from_checkpoint),
        ).check()
    except ValueError as error:
        raise UsageError(f"argument --output-dir: {error}") from None
    run = train(args.recipe.data, args.recipe.encoder, training_args=training, recipe_args=args.recipe)
    if process_rank_and_count()[0] != 0:  # launched as several processes: one table, the main process's
        return 0
    layout, skipped = run.layout, run.trainer.non_finite_guard.skipped_steps
    summary = format_summary(
        "Test metrics (%)",
        run.test_metrics,
        {
            "labels": f"{layout.label_count:,} (head {layout.head_label_count:,}, tail {layout.tail_label_count:,} in groups of {layout.group_size}, fan-in {args.recipe.fan_in})",
            "grouping": layout.strategy,
            "propensity": f"A={run.propensity.a}, B={run.propensity.b}",
            "steps": f"{run.trainer.state.global_step}"
            + (f" ({skipped} skipped: NaN or infinite gradients)" if skipped else ""),
            "time": f"{run.training_seconds / 60:.1f} min",
            "saved to": run.output_dir,
        },
    )
    print(summary)
    return 0


def load_trained(args):
    """The model and tokenizer of `args.model`; the data flags left unset take the values training used."""
    from transformers import AutoTokenizer

    from ..evaluation import saved_evaluation_settings
    from ..modeling.modeling_haste import HasteForExtremeClassification
    from ..modeling.saving import read_one_save
    from ..recipe import check_max_length, encoder_token_limit

    from_training = saved_evaluation_settings(args.model) if Path(args.model).is_dir() else {}
    for name, value in from_training.items():
        if getattr(args, name, None) is None or (name == "format" and args.format == "auto"):
            setattr(args, name, value)
    args.eval_batch_size = args.eval_batch_size or DEFAULT_EVAL_BATCH_SIZE
    device, load_model = default_device(), HasteForExtremeClassification.from_pretrained
    if launched_processes() > 1:  # each rank loads and scores its share of the output layer's labels
        from ..training.shard_checkpoints import load_sharded_model

        device = join_process_group()
        load_model = functools.partial(load_sharded_model, device=device)  # the share made on the GPU, not the host
    try:
        # The tokenizer of the same save as the weights (`read_one_save`).
        model, tokenizer = read_one_save(
            args.model, lambda: (load_model(args.model), AutoTokenizer.from_pretrained(args.model))
        )
    except Exception as error:
        if not is_model_file_error(error):
            raise
        raise ValueError(
            f"{args.model}: its weights do not load ({one_line(error)}); save or download the model again"
        ) from error
    if args.max_length is None:  # a folder `train` did not write: the encoder's limit, at most the default
        args.max_length = min(DEFAULT_MAX_LENGTH, encoder_token_limit(model.encoder) or DEFAULT_MAX_LENGTH)
    try:
        check_max_length(model.encoder, args.max_length, f"of {args.model}")
    except ValueError as error:
        raise UsageError(error) from None
    return model.to(device), tokenizer


def check_split(args, data):
    if args.split not in data.splits:
        raise UsageError(
            f"argument --split: {args.split!r} is not a split of the dataset (splits: {', '.join(sorted(data.splits))})"
        )


def labels_match(model, data) -> bool:
    """Whether `data` has the model's labels: as many, and the same names where both have names."""
    names, data_names = model.label_names, data.label_texts
    return data.label_count == model.config.label_count and (names is None or data_names is None or names == data_names)


def check_label_names(args, model, data) -> None:
    """Refuses data whose label names differ from the model's (the same count, another label space or order),
    unless `--ignore-label-names`: the metrics would score each label id against another label."""
    names, data_names = model.label_names, data.label_texts
    if args.ignore_label_names or names is None or data_names is None:
        return
    from ..modeling.label_names import first_difference

    first = first_difference(names, data_names)  # tables of 10^9 names are compared as bytes, not name by name
    if first is not None:
        differing = sum(name != data_name for name, data_name in zip(names, data_names))
        raise UsageError(
            f"the labels of the model at {args.model} are not the dataset's: {differing:,} of {len(names):,} names "
            f"differ (label {first} is {names[first]!r} in the model, {data_names[first]!r} in the dataset). Evaluate "
            "the model on the dataset it was trained for, or pass --ignore-label-names to score it by label id anyway."
        )


def command_evaluate(args) -> int:
    from ..modeling.saving import atomic_path

    model, tokenizer = load_trained(args)
    data = load_data(args)
    check_split(args, data)
    if data.label_count != model.config.label_count:
        raise UsageError(
            f"the model at {args.model} has {model.config.label_count:,} labels and the dataset {data.label_count:,}: "
            "evaluate a model on the dataset it was trained for"
            + (" (no --data was given, so the embedded demo set was read)." if args.data is None else ".")
        )
    check_label_names(args, model, data)
    propensity = propensity_for(args, data)
    metrics = evaluate_split(model, tokenizer, data, args.split, args, propensity)
    if not is_main_process():
        return 0
    print(format_summary(f"{args.split} metrics (%)", metrics, {"propensity": f"A={propensity.a}, B={propensity.b}"}))
    if args.output:
        with atomic_path(args.output) as path:
            Path(path).write_text(json.dumps(metrics, indent=2))
    return 0


def read_texts(path: str) -> list[str]:
    """One text per line (line ends removed, blank lines kept so outputs stay aligned with the input)."""
    data = Path(path).read_bytes()
    try:
        texts = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise UsageError(
            f"argument --input: {path} line {line} is not UTF-8 text ({error.reason}: byte {data[error.start]:#04x} at "
            f"column {column}); save the file as UTF-8"
        ) from None
    if not texts:
        raise UsageError(f"argument --input: {path} holds no texts (one text per line)")
    return texts


def command_predict(args) -> int:
    import numpy as np

    from ..evaluation import predict_top_k
    from ..modeling.saving import atomic_path

    texts = read_texts(args.input) if args.input else None
    model, tokenizer = load_trained(args)
    if args.k > model.config.label_count:
        raise UsageError(f"argument -k: {args.k} exceeds the {model.config.label_count} labels of the model")
    if texts is None:
        # The labels' texts only tell whether the model is the demo set's (without --data); none is read otherwise
        # (~34 GB at 10^9 labels, in every process of a run on several GPUs).
        data = load_data(args, None if args.data is None else lambda count: (0, 0))
        check_split(args, data)
        if args.data is None and not labels_match(model, data):
            raise UsageError(
                f"argument --input: without --input or --data, predict labels the embedded demo set's texts, and the "
                f"model at {args.model} was not trained on it ({model.config.label_count:,} labels, the demo set "
                f"{data.label_count:,}): give --input (a text file, one text per line) or --data (a dataset folder)"
            )
        texts = data.splits[args.split]["text"]
    ids, logits = predict_top_k(model, tokenizer, texts, args.k, args.eval_batch_size, args.max_length)
    # As the text-classification pipeline scores them: each label's own sigmoid probability.
    if not is_main_process():  # every rank has all rows: the first writes them
        return 0
    scores = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    names = model.label_names
    with atomic_path(args.output) as path, open(path, "w", encoding="utf-8") as f:
        for row_ids, row_scores, row_logits in zip(ids.tolist(), scores.tolist(), logits.tolist()):
            record = {"label_ids": row_ids, "scores": [round(s, 6) for s in row_scores]}
            if args.logits:
                record["logits"] = [round(s, 6) for s in row_logits]
            if names is not None:
                record["labels"] = [names[i] for i in row_ids]
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    print(f"Wrote the top {args.k} labels of {len(texts):,} texts to {args.output}")
    return 0


# `RecipeArguments` that shape the model or its evaluation, not the label layout `haste-hf group` computes.
_NOT_GROUP_OPTIONS = (
    "fan_in",
    "init_from_label_texts",
    "label_text_init_scale",
    "head_projection_dim",
    "tail_projection_dim",
    "tail_bias",
    "layout_file",
    "dataset_name",
    "propensity_a",
    "propensity_b",
)


def command_group(args) -> int:
    from ..modeling.logging_utils import get_logger
    from ..recipe import (
        RecipeArguments,
        build_layout,
        check_max_length,
        encoder_pooling,
        label_texts_for,
        load_dataset,
        load_encoder,
        split_validation,
    )

    logger = get_logger(__name__)
    recipe = args.recipe
    ignored = [
        name
        for name in _NOT_GROUP_OPTIONS
        if getattr(recipe, name) != RecipeArguments.__dataclass_fields__[name].default
    ]
    if ignored:
        logger.warning(
            f"Ignored by `haste-hf group` (they are `train` options): {', '.join('--' + n.replace('_', '-') for n in ignored)}."
        )
    reads_texts = recipe.label_texts or recipe.label_text_grouping_below  # else none is read (~34 GB at 10^9 labels)
    share = None if reads_texts else lambda count: (0, 0)
    data = load_dataset(recipe.data, recipe.format, recipe.text_fields, recipe.label_texts, share)
    label_texts = label_texts_for(data, recipe.data, label_text_grouping_below=recipe.label_text_grouping_below)
    train_split, _ = split_validation(data.splits["train"], recipe.validation_fraction, args.seed)
    encoder, tokenizer = load_encoder(recipe.encoder)
    pooling = encoder_pooling(recipe.encoder, encoder, recipe.pooling)
    check_max_length(encoder, recipe.max_length, recipe.encoder)
    layout = build_layout(
        train_split,
        data.label_count,
        encoder,
        tokenizer,
        group_size=recipe.group_size,
        head_label_fraction=recipe.head_label_fraction,
        grouping=recipe.grouping,
        pooling=pooling,
        beta=recipe.beta,
        seed=args.seed,
        max_length=recipe.max_length,
        batch_size=args.per_device_eval_batch_size,
        label_texts=label_texts,
        label_text_grouping_below=recipe.label_text_grouping_below,
        frequency_bands=recipe.frequency_bands,
    )
    layout.save(args.output)
    print(f"{layout.describe()} -> {args.output}")
    return 0


def command_push(args) -> int:
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError

    from ..hub import push_to_hub

    try:
        url = push_to_hub(
            args.model, args.repo_id, private=args.private, revision=args.revision, commit_message=args.commit_message
        )
    except HfHubHTTPError as error:
        if getattr(error.response, "status_code", None) != 401:
            raise
        raise ValueError(
            f"the Hub at {constants.ENDPOINT} refused the credentials (401 Unauthorized): log in with `hf auth login` "
            "(or set HF_TOKEN to a token with write access), then run the command again."
        ) from None
    print(f"Pushed {args.model} to {url}")
    return 0


def command_export(args) -> int:
    from ..export import check_export_dependencies, check_export_dir, export_onnx

    try:
        check_export_dependencies()
    except ImportError as error:
        report(args.prog, f"error: {one_line(error)}")
        return 1
    output = args.output or f"{Path(args.model).name}-onnx"
    try:
        check_export_dir(output, args.overwrite)
    except ValueError as error:
        raise UsageError(f"argument --output: {error}") from None
    layout = export_onnx(
        args.model,
        output,
        args.k,
        layout="split" if args.split_output_layer else "auto",
        quantize=args.quantize,
        overwrite=args.overwrite,
    )
    print(f"Exported {args.model} to {output} ({layout} layout; see {Path(output) / 'README.md'})")
    return 0


def copy_keeping_a_link(source: Path, destination: Path) -> None:
    """Copies the file `source` (if there is one) to `destination`; a link is copied as the same link, never turned
    into a file holding what it points to (which a push would then publish). Opened without following a link, so
    that a file swapped for one meanwhile is not read either."""
    import errno
    import stat

    try:
        handle = os.open(source, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        os.symlink(os.readlink(source), destination)
        return
    with os.fdopen(handle, "rb") as file:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            raise ValueError(f"{source} is not a regular file: remove it, then run the command again.")
        destination.write_bytes(file.read())


def command_add_labels(args) -> int:
    import datetime
    import shutil

    from ..evaluation import EVALUATION_SETTINGS_FILE
    from ..labels.additions import check_new_names
    from ..labels.new_label_files import examples_from_split, read_new_labels, sample_texts
    from ..model_card import PLOT_FILE, LabelAddition, card_with_added_labels
    from ..modeling.saving import save_trained_folder
    from ..recipe import check_output_dir, load_dataset

    try:
        check_output_dir(args.output_dir, overwrite=args.overwrite_output_dir)
    except ValueError as error:
        raise UsageError(f"argument --output-dir: {error}") from None
    if args.data is not None and args.negatives is None:
        raise UsageError("argument --data: fitting the new labels on examples needs --negatives (the training data)")
    model, tokenizer = load_trained(args)
    try:
        texts, names = read_new_labels(args.labels)
        names = check_new_names(model, texts, names)
    except ValueError as error:
        raise UsageError(f"argument --labels: {one_line(error)}") from None
    examples = None
    if args.data is not None:
        try:
            examples = examples_from_split(
                load_dataset(args.data, args.format, args.text_fields).splits["train"], len(texts)
            )
        except ValueError as error:
            raise UsageError(f"argument --data: {one_line(error)}") from None
    negatives = None
    if args.negatives is not None:
        negatives = sample_texts(
            load_dataset(args.negatives, args.format, args.text_fields).splits["train"], args.negative_count, args.seed
        )
    head_before = model.config.head_label_count
    ids = model.add_labels(
        texts,
        examples=examples,
        negatives=negatives,
        names=names,
        head=None if args.branch is None else args.branch == "head",
        tokenizer=tokenizer,
        seed=args.seed,
        batch_size=args.eval_batch_size,
        max_length=args.max_length,
    )
    branch = "head" if model.config.head_label_count > head_before else "tail"
    settings = Path(args.model) / EVALUATION_SETTINGS_FILE
    addition = LabelAddition(
        ids=ids,
        names=names,
        texts=texts,
        branch=branch,
        example_count=sum(len(values) for values in examples or []),
        negative_count=len(negatives or []),
        when=datetime.datetime.now(datetime.timezone.utc),
    )

    def write_extra(folder: Path):
        copy_keeping_a_link(settings, folder / settings.name)  # evaluate and predict read texts as training did
        # The card: the model's own (a regular file: a link is not followed), with this addition appended.
        source = Path(args.model)
        card = source / "README.md"
        text = card.read_text(encoding="utf-8") if card.is_file() and not card.is_symlink() else None
        if text is not None and (source / PLOT_FILE).is_file() and not (source / PLOT_FILE).is_symlink():
            shutil.copyfile(source / PLOT_FILE, folder / PLOT_FILE)  # the card shows it
        text = card_with_added_labels(text, model, Path(args.output_dir).name, addition)
        (folder / "README.md").write_text(text, encoding="utf-8")

    save_trained_folder(args.output_dir, model, tokenizer, write_extra)
    where = f"the {branch}"
    print(f"{len(ids)} labels added to {where} (ids {ids[0]} to {ids[-1]}) -> {args.output_dir}")
    return 0


def handler_of(command: str):
    """The function that runs `command`, looked up when it runs."""
    return {
        "train": command_train,
        "demo": command_train,
        "evaluate": command_evaluate,
        "predict": command_predict,
        "group": command_group,
        "push": command_push,
        "export": command_export,
        "add-labels": command_add_labels,
    }[command]


def _run_command(args) -> int:
    """The command's handler; under torchrun, this process's part of the process group ended once the handler (and
    the trainer it held) is gone (`end_process_group` says why). Left to the interpreter's exit, gloo's threads can be
    torn down while running, and the rank hangs or aborts after its work, failing a finished run."""
    had_group = _process_group_started()  # a caller's own group (a script calling `main`) is the caller's to end
    status = handler_of(args.command)(args)
    if not had_group and _process_group_started():
        from haste_hf.training.distributed import end_process_group

        end_process_group()
    return status


def _process_group_started() -> bool:
    if "torch" not in sys.modules:  # nothing heavy loaded: no process group either
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def main(argv=None) -> int:
    """Runs a command. Usage errors (bad flags, paths, combinations) print one line and exit with status 2,
    before anything heavy loads where they can be told from the arguments; errors the library reports
    (bad data, a diverged run, a refused file) print their message in one line and exit with status 1.
    `HASTE_HF_DEBUG=1` shows tracebacks instead."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(argv)
    except UsageError as error:
        command = f" {argv[0]}" if argv and not argv[0].startswith("-") else ""
        report(f"haste-hf{command}", f"error: {one_line(error)}")
        return 2
    if os.environ.get(DEBUG_VARIABLE):
        return _run_command(args)
    from ..training.run_lock import OutputDirInUseError

    try:
        return _run_command(args)
    except UsageError as error:
        report(args.prog, f"error: {one_line(error)}")
        return 2
    except (ValueError, TypeError, OSError, FloatingPointError, OutputDirInUseError) as error:
        report(args.prog, f"error: {one_line(error)}")
        return 1
    except Exception as error:  # a damaged file that no caller named: the traceback shows which
        if not is_model_file_error(error):
            raise
        report(
            args.prog,
            f"error: {one_line(error)} (a damaged or mismatched weights file; {DEBUG_VARIABLE}=1 shows which)",
        )
        return 1
    except KeyboardInterrupt:
        report(args.prog, "interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
