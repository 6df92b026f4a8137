"""Saves two models, in turn, to one folder until a deadline: the writer of test_concurrent_saves.py.

`python concurrent_saver.py SOURCE_A SOURCE_B TARGET SECONDS`: each source is a saved model with its tokenizer;
every save writes the weights, label names, configuration and tokenizer of one of them (`save_trained_folder`).
Prints the number of saves.
"""

import random
import sys
import time

from transformers import AutoTokenizer

from haste_hf import HasteForExtremeClassification
from haste_hf.modeling.saving import save_trained_folder


def main(sources, target, seconds):
    pairs = [(HasteForExtremeClassification.from_pretrained(s), AutoTokenizer.from_pretrained(s)) for s in sources]
    deadline, saves = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        model, tokenizer = pairs[saves % 2]
        save_trained_folder(target, model, tokenizer)
        saves += 1
        time.sleep(random.uniform(0, 0.05))  # readers sometimes find the folder at rest
    print(saves, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:3], sys.argv[3], float(sys.argv[4]))
