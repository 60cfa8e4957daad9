"""A randomly initialised SmolLM2-135M (the real config and tokenizer, no weights: the
weights do not fit the device call's 64 MiB), saved as a Hugging Face folder."""

import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

src, dst = sys.argv[1:3]
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src))
model.save_pretrained(dst)
AutoTokenizer.from_pretrained(src).save_pretrained(dst)
print("saved", dst, sum(p.numel() for p in model.parameters()), "parameters")
