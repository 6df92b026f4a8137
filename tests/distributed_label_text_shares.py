"""Each rank of a label-sharded `haste-hf train` reads only its share of the label texts: `torchrun --nproc_per_node 2
distributed_label_text_shares.py OUT` (from test_distributed.py) trains on OUT/data (written by the test) into
OUT/run, resumes it with the same data, then with OUT/renamed (the same data, label 20's text changed), and writes
OUT/rank-R.pt.

`MAX_CONFIG_LABEL_NAMES` is lowered to 10 (config.json names the labels up to it, and the share starts past it), as
30 labels stand in for 10^9. Each rank reports the label texts the data gave it (type, the ids held, their bytes),
whether its label layout holds the training counts, and each command's exit status.
"""

import os
import sys
from pathlib import Path

import torch

from haste_hf import recipe
from haste_hf.cli.commands import main as cli
from haste_hf.modeling import configuration_haste
from haste_hf.modeling.label_names import LabelNameTable


def main(output: Path):
    configuration_haste.MAX_CONFIG_LABEL_NAMES = 10
    given, dataset_of = [], recipe._dataset_of

    def recording(*args, **kwargs):
        dataset, label_texts, options = dataset_of(*args, **kwargs)
        texts = dataset.label_texts
        table = isinstance(texts, LabelNameTable)
        held = texts.held if table else (0, len(texts))
        given.append(
            dict(
                table=table,
                count=len(texts),
                held=held,
                bytes=sum(data.nbytes for _, data in texts.pieces) if table else None,
                names=[texts[i] for i in range(*held)],
                for_init=label_texts,
            )
        )
        return dataset, label_texts, options

    recipe._dataset_of = recording
    layouts, shared_layout = [], recipe._shared_layout

    def recording_layout(*args, **kwargs):
        layout = shared_layout(*args, **kwargs)
        layouts.append(layout.label_frequencies is not None)
        return layout

    recipe._shared_layout = recording_layout
    arguments = (output / "arguments.txt").read_text().split("\n")
    run = ["--output-dir", str(output / "run"), "--no_init_from_label_texts"]
    codes = [cli([*arguments, *run, "--max-steps", "2", "--save-steps", "2"])]
    codes.append(cli([*arguments, *run, "--max-steps", "4", "--save-steps", "2", "--resume-from-checkpoint"]))
    renamed = [str(output / "renamed") if argument == str(output / "data") else argument for argument in arguments]
    codes.append(cli([*renamed, *run, "--max-steps", "6", "--save-steps", "2", "--resume-from-checkpoint"]))
    torch.save(dict(given=given, codes=codes, layout_counts=layouts), output / f"rank-{os.environ['RANK']}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
