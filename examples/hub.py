"""Publish a trained HASTE model on the Hugging Face Hub and load it back, with and without haste_hf.

    huggingface-cli login                     # or set HF_TOKEN
    haste-hf demo                             # trains ./haste-demo (or use any trained model folder)
    python examples/hub.py --model haste-demo --repo-id YOUR_NAME/haste-debian-tags

One commit uploads the config, the safetensors weights (supports and label map included), the label
names, the tokenizer, the model card with its plot, and the modeling code, so that the model also loads
where haste_hf is not installed (`trust_remote_code=True`).
"""

import argparse
import subprocess
import sys
import textwrap

import torch
from transformers import AutoModel, AutoTokenizer

import haste_hf  # noqa: F401  (registers the HASTE classes with AutoModel)
from haste_hf.hub import push_to_hub


parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--model", required=True, help="Folder of a trained model (with its tokenizer).")
parser.add_argument("--repo-id", required=True, help="Hub repository, e.g. you/haste-debian-tags.")
parser.add_argument("--private", action="store_true")
parser.add_argument("--branch", default=None, help="Push to this branch (created if missing) instead of main.")
args = parser.parse_args()

# 1. Publish the folder as it was saved (checkpoint-* folders and logs are left out).
commit = push_to_hub(
    args.model, args.repo_id, private=args.private, revision=args.branch, commit_message="Upload HASTE model"
)
print(f"Pushed: {commit.commit_url}")

# 2. Load it back with haste_hf imported: the installed classes serve it.
model = AutoModel.from_pretrained(args.repo_id, revision=args.branch).eval()
tokenizer = AutoTokenizer.from_pretrained(args.repo_id, revision=args.branch)
texts = ["fast C library for parsing JSON", "GTK based image viewer"]
batch = tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=32)
with torch.no_grad():
    top = model.predict_topk(**batch, k=3)
for text, ids in zip(texts, top.label_ids.tolist()):
    print(text, "->", [model.label_names[i] for i in ids])

# 3. Load it in a fresh interpreter that cannot import haste_hf: the code pushed with the weights runs.
script = textwrap.dedent(f"""
    import sys
    sys.modules["haste_hf"] = None  # as on a machine without the package
    import torch
    from transformers import AutoModel, AutoTokenizer
    model = AutoModel.from_pretrained({args.repo_id!r}, revision={args.branch!r}, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained({args.repo_id!r}, revision={args.branch!r}, trust_remote_code=True)
    batch = tokenizer({texts!r}, return_tensors="pt", padding=True, truncation=True, max_length=32)
    with torch.no_grad():
        print(model.predict_topk(**batch, k=3).label_ids.tolist())
""")
remote = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.strip()
same = remote == str(top.label_ids.tolist())
print(f"Without haste_hf: {remote} (same as above: {same})")
