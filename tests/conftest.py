"""Shared test settings.

torch's default of one thread per core makes OpenMP spin against the other pytest worker
on a 2-core machine (5-10x slower, timings that swing 10x); one thread per worker is both
faster and steadier. The environment variables are set before any test imports torch;
``one_torch_thread`` pins torch itself for tests that run a model.
"""

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one thread for the module's tests, restored afterwards."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
