# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""An encoder folder packed for a size-limited transfer: every 2-D float weight as int8 with one fp16 scale per
row (symmetric, max-abs), everything else as fp16; unpacked on the far side into a float32 folder that
`from_pretrained` reads. Variants compared in one study all read the same unpacked copy, so the rounding is the
same for each of them.

    python benchmarks/int8_transit.py pack path/to/all-MiniLM-L6-v2 .device-data/minilm-int8
    python benchmarks/int8_transit.py unpack .device-data/minilm-int8 /tmp/minilm
"""

import argparse
import shutil
import sys
from pathlib import Path


PACKED_FILE = "model_int8.safetensors"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def pack(source: Path, target: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(source / "model.safetensors")
    packed = {}
    for name, tensor in tensors.items():
        if tensor.dim() == 2 and tensor.is_floating_point():
            scale = tensor.float().abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127
            packed[f"{name}.int8"] = torch.round(tensor.float() / scale).to(torch.int8)
            packed[f"{name}.scale"] = scale.to(torch.float16)
        else:
            packed[name] = tensor.to(torch.float16) if tensor.is_floating_point() else tensor
    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():  # config, tokenizer, sentence-transformers files: everything but the weights
        if path.is_file() and path.name not in WEIGHT_FILES:
            shutil.copy2(path, target / path.name)
        elif path.is_dir():
            shutil.copytree(path, target / path.name, dirs_exist_ok=True)
    save_file(packed, target / PACKED_FILE)


def unpack(source: Path, target: Path) -> Path:
    """`source` unpacked into `target` (a float32 `model.safetensors`); returns `target`."""
    from safetensors.torch import load_file, save_file

    packed = load_file(source / PACKED_FILE)
    tensors = {}
    for name, tensor in packed.items():
        if name.endswith(".int8"):
            base = name[: -len(".int8")]
            tensors[base] = tensor.float() * packed[f"{base}.scale"].float()
        elif not name.endswith(".scale"):
            tensors[name] = tensor.float() if tensor.is_floating_point() else tensor
    shutil.copytree(source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns(PACKED_FILE))
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    return target


def is_packed(folder) -> bool:
    return (Path(folder) / PACKED_FILE).is_file()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["pack", "unpack"])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    (pack if args.action == "pack" else unpack)(args.source, args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
