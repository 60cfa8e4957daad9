"""Shared test settings.

torch's default of one thread per core makes OpenMP spin against the other pytest worker
on a 2-core machine (5-10x slower, timings that swing 10x); one thread per worker is both
faster and steadier. Set before any test imports torch.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
