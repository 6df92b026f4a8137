# Copyright 2026 The haste_hf Authors. Licensed under the Apache License, Version 2.0.
"""Texts to flat token arrays (`encode_rows`), in this process or in worker processes (`TokenizerProcesses`).

The Rust tokenizer encodes a batch with the GIL released, but its result is one Python `Encoding` per text, and
reading each one's ids into arrays is per-text Python under the GIL: a few microseconds a text, which at millions
of short texts (8.6M labels of three words) serialises the threads that tokenise ahead and starves the thread that
runs the encoder. Worker processes each hold their own GIL: each tokenises a chunk alone and sends back two flat
arrays, and this process only sorts and batches them (`token_batches.token_chunk`).

A worker is this file run as a script by the interpreter of this process (not `multiprocessing`: its spawn runs the
user's main script again in every worker, and a fork copies a process that holds CUDA and threads); it imports
numpy and tokenizers alone. Messages are pickles with a length before each, over the worker's stdin and stdout.
"""

import contextlib
import os
import pickle
import queue
import struct
import subprocess
import sys
from itertools import chain

import numpy as np


# A process gets this many tokenizer workers per its share of the CPUs (less one for the encoder's thread and one
# for sorting the chunks), at most `MAX_PROCESSES`, and none with fewer than 2 (a worker's start, about half a
# second, then buys nothing).
MAX_PROCESSES = 32
# The fewest texts that start workers: below, the threads of this process tokenise them in about a second.
MIN_TEXTS = 131072
# How long a worker has to finish once its input is closed, before it is killed.
STOP_SECONDS = 10
_LENGTH = struct.Struct("<Q")


def _flat(rows, count: int) -> np.ndarray:
    return np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=count)


def csr_rows(rows: list) -> tuple[np.ndarray, np.ndarray]:
    """`(flat int64 values, int64 lengths)` of a list of integer sequences."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    return _flat(rows, int(lengths.sum())), lengths


def encode_rows(backend, texts: list[str], with_types: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """`(flat token ids, lengths, flat token type ids or None)` (int64, text after text in the order given) of
    `texts` encoded by the Rust tokenizer `backend` (`token_batches.fast_backend`); the type ids only with
    `with_types` and where one of them is not zero."""
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)  # `_fast`: no character offsets
    encodings = encode(texts)
    flat_tokens, lengths = csr_rows([encoding.ids for encoding in encodings])
    flat_types = None
    if with_types and any(any(encoding.type_ids) for encoding in encodings):
        flat_types = _flat((encoding.type_ids for encoding in encodings), flat_tokens.size)
    return flat_tokens, lengths, flat_types


def process_count() -> int:
    """The tokenizer workers this process may start: its CPUs (shared by the ranks of this machine) less two."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    count = min(MAX_PROCESSES, cpus // ranks - 2)
    return count if count >= 2 else 0


def _send(stream, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)))
    stream.write(data)
    stream.flush()


def _receive(stream):
    """The next message, or None at the end of the stream."""
    header = stream.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
        return None
    (size,) = _LENGTH.unpack(header)
    data = stream.read(size)
    return None if len(data) < size else pickle.loads(data)


class TokenizerProcesses:
    """`count` worker processes, each with a copy of the Rust tokenizer `backend`: `encode(texts)` is
    `encode_rows(backend, texts, with_types)` run in an idle worker (safe from any thread: a call waits for one).
    A context manager: leaving it stops the workers."""

    def __init__(self, backend, count: int, with_types: bool):
        self._idle = queue.SimpleQueue()
        self._workers = []
        # One thread a worker: the workers are the parallelism. The copy of this process's environment keeps
        # its module paths.
        environment = os.environ | {"TOKENIZERS_PARALLELISM": "false"}
        setup = (backend.to_str(), with_types)
        try:
            for _ in range(count):
                worker = subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env=environment,
                )
                self._workers.append(worker)
                _send(worker.stdin, setup)
                self._idle.put(worker)
        except BaseException:
            self.close()
            raise

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        worker = self._idle.get()
        try:
            _send(worker.stdin, texts)
            reply = _receive(worker.stdout)
        except OSError:  # a broken pipe: the worker has ended
            reply = None
        self._idle.put(worker)  # also an ended one: the next call finds it ended, where waiting would hang
        if reply is None:
            raise RuntimeError(
                f"A tokenizer worker process ended (exit code {worker.poll()}) while tokenising the texts; its "
                "error, if any, is printed above."
            )
        status, value = reply
        if status == "error":
            raise RuntimeError(f"Tokenising the texts in a worker process failed: {value}")
        return value

    def close(self) -> None:
        for worker in self._workers:
            with contextlib.suppress(OSError):  # a broken pipe: it has ended
                worker.stdin.close()
        for worker in self._workers:
            try:
                worker.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
            worker.stdout.close()
        self._workers = []

    def __enter__(self) -> "TokenizerProcesses":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _serve(inputs, outputs) -> None:
    """A worker's loop: the tokenizer and `with_types`, then texts after texts, each answered by `("ok",
    encode_rows(...))` or `("error", message)`, until its input ends."""
    from tokenizers import Tokenizer

    serialized, with_types = _receive(inputs)
    backend = Tokenizer.from_str(serialized)
    while (texts := _receive(inputs)) is not None:
        try:
            reply = ("ok", encode_rows(backend, texts, with_types))
        except Exception as error:  # sent back: the parent raises it where the texts were asked for
            reply = ("error", f"{type(error).__name__}: {error}")
        _send(outputs, reply)


if __name__ == "__main__":
    replies, sys.stdout = sys.stdout.buffer, sys.stderr  # whatever else prints goes to stderr, not into the replies
    _serve(sys.stdin.buffer, replies)
