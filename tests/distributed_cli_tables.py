"""`haste-hf ARGS` under torchrun with the data's label texts read as a compact `LabelNameTable`, as they are past
`COMPACT_LABEL_TEXTS_FROM` (20M) labels: `torchrun --nproc_per_node 2 distributed_cli_tables.py train ...` (from
test_label_names.py)."""

import sys

from haste_hf import xmc_files
from haste_hf.cli import main
from haste_hf.training.distributed import end_process_group


if __name__ == "__main__":
    xmc_files.COMPACT_LABEL_TEXTS_FROM = 1
    status = main(sys.argv[1:])
    end_process_group()
    sys.exit(status)
