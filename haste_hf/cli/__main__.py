# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""`python -m haste_hf.cli` (and `torchrun -m haste_hf.cli`): the `haste-hf` command."""

import sys

from .commands import main


sys.exit(main())
