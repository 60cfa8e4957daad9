"""What an ``evaluate`` run costs in memory, and the check that refuses a run this machine
cannot hold before any replay starts.

Peak resident memory of evaluate, the model fitted to the runs of
benchmarks/bench_scale.py (docs/scale.md), for P prompts:

    BASE + held + TRANSIENT * P + min(R_t * P * STREAM_PROMPT_BYTES, STREAM_BYTES)

``held``: the reward matrices (one narrow matrix per policy, 2 bytes a rollout for 0/1
rewards) and each checkpoint's oracle, pool and cache arrays; BASE: the interpreter and its
libraries, and every working set that does not grow with P (the one-step replay's sort keys,
drawn 2^20 at a time; the trajectory's blocks of draws and the stateless estimators' blocks
of visits); TRANSIENT covers what the trajectory replay holds per prompt besides its streams
(each checkpoint's pool, oracle and noise, the reference cache and its tilt table) and
allocator slack (BASE and TRANSIENT fitted to the peaks measured at 2,500, 10,000 and 17,398
prompts, 443 to 504 MiB in one run of the grid, predicting each from above). The trajectory replay (when on) runs
R_t = min(repeats, 200) streams, each holding per prompt its epoch's shuffle and the
stateful estimators' state (STREAM_PROMPT_BYTES with the default estimators), as many
together as STREAM_BYTES (64 MiB) holds
(:func:`~basis_bench.evaluation.trajectory.stream_group`). Repeats beyond that cost time,
never memory: per-repeat values are running sums.
"""

from __future__ import annotations

from collections.abc import Iterable

from basis_bench.errors import InputError
from basis_bench.evaluation.config import given
from basis_bench.evaluation.dataset import CheckpointData, Rewards
from basis_bench.evaluation.replay_plan import SHUFFLE_BYTES, stream_group
from basis_bench.guards.memory_check import available_memory

# interpreter, numpy/polars/pyarrow, allocator slack, blocks of draws (375 MiB fitted), and
# numba's compiled loops with LLVM (about 100 MiB more, measured at 500 prompts: 546 against
# 450 MiB before numba; their first compilation holds some 130 MiB more while it runs)
BASE_BYTES = 475 * 2**20
TRANSIENT_BYTES = 2 * 1024  # per prompt: the trajectory's pools, cache and tilt table, slack
# per stream and prompt, default estimators: shuffle, basis_memory's and basis_context's
# discounted histories (4 gammas x 2 x 8 bytes each), the SPO tracker's alpha and beta
STREAM_PROMPT_BYTES = SHUFFLE_BYTES + 64 + 64 + 16


def held_bytes(rewards: Rewards, datas: Iterable[CheckpointData]) -> int:
    """Bytes of the loaded data: reward matrices and the checkpoints' pools and caches."""
    held = sum(r.matrix.nbytes for r in rewards.values())
    return held + sum(d.pool.nbytes + d.cache.nbytes for d in datas)


def evaluate_memory(prompts: int, held: int, streams: int) -> int:
    """Predicted peak resident bytes of evaluate (the model above); ``streams`` = R_t, 0
    without the trajectory replay."""
    together = stream_group(streams, prompts * STREAM_PROMPT_BYTES) if streams else 0
    per_prompt = TRANSIENT_BYTES + together * STREAM_PROMPT_BYTES
    return BASE_BYTES + held + per_prompt * prompts


def check_memory(prompts: int, held: int, streams: int) -> int:
    """The predicted peak; an InputError naming the option that fits when it exceeds the
    machine's free memory (``held`` is already resident, so it counts as free)."""
    need = evaluate_memory(prompts, held, streams)
    free = available_memory()
    if free is None or need <= free + held:
        return need
    gib = 2**30
    lighter = evaluate_memory(prompts, held, 0)
    if streams and lighter <= free + held:
        fix = f"pass {given('trajectory', False)} (about {lighter / gib:.1f} GiB)"
    else:
        fewer = given("checkpoints", "NAME")
        fix = f"evaluate fewer checkpoints at a time ({fewer}) or free memory"
    raise InputError(
        f"this evaluate needs about {need / gib:.1f} GiB ({prompts} prompts) but "
        f"{free / gib:.1f} GiB is free; {fix}"
    )
