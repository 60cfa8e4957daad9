"""Third-party progress bars off when stderr is not a terminal.

transformers ("Loading weights", "Writing model shards", "Converting and de-quantizing GGUF
tensors"), the Hugging Face Hub's downloads, datasets and vLLM draw tqdm bars: in a log file
or a pipe each is a run of carriage returns, not a line. This project's own progress lines
say what those bars would. The switches are environment variables, read by those libraries
when they are imported (after the command line starts), so they must be set first; a value
the user set is kept (``TQDM_DISABLE=0`` brings the bars back).
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

SWITCHES = {
    "TQDM_DISABLE": "1",  # every tqdm bar's default (tqdm >= 4.66): transformers' GGUF load, vLLM
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # the Hub's bars, and transformers' own tqdm wrapper
}


def quiet_progress_bars(stream: TextIO | None = None) -> bool:
    """Turn the bars off unless ``stream`` (stderr) is a terminal; True when they were."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        return False
    for name, value in SWITCHES.items():
        os.environ.setdefault(name, value)
    return True
