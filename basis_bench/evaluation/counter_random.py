"""Counter-based random numbers: a uniform, or a position in a random permutation, is a pure
function of (seed, tag, indices).

The step replay draws per (repeat, step, prompt, slot); with a counter-based generator any
subset of repeats (a memory pass) reads exactly the numbers the whole run would, whatever
order or grouping it computes them in, and no stream of draws has to be advanced or held.
The mixer is SplitMix64's finaliser (Steele, Lea & Flood 2014), applied to the running hash
xor each key; uniforms take its top 53 bits. ``permute`` is a keyed bijection of [0, n)
(a 4-round Feistel network on the smallest even power of two >= n, cycle-walking the values
that fall outside [0, n)), so a prompt's pool is read in a different random order by every
repeat, each sample once before any is reused.
"""

from __future__ import annotations

import zlib

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
FEISTEL_ROUNDS = 4


def tag(name: str) -> int:
    """A stable integer for a stream's name (the same in every process and platform)."""
    return zlib.crc32(name.encode())


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a bijection of uint64 that scrambles every bit."""
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def hash_keys(seed: int, *keys: np.ndarray | int) -> np.ndarray:
    """uint64 hashes of (seed, *keys), the keys broadcast against each other."""
    h = _mix(np.asarray(seed, dtype=np.uint64))
    for key in keys:
        h = _mix(h ^ np.asarray(key, dtype=np.int64).astype(np.uint64))
    return np.asarray(h, dtype=np.uint64)


def uniforms(seed: int, *keys: np.ndarray | int) -> np.ndarray:
    """Uniforms in [0, 1), one per broadcast key: the hash's top 53 bits / 2^53."""
    return (hash_keys(seed, *keys) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def permute(position: np.ndarray, n: np.ndarray, seed: int, *keys: np.ndarray | int) -> np.ndarray:
    """Element ``position`` (< n) of a random permutation of [0, n), one permutation per
    broadcast key: for fixed keys, a bijection of [0, n)."""
    position, n = np.broadcast_arrays(np.asarray(position, np.int64), np.asarray(n, np.int64))
    if np.any((position < 0) | (position >= n)):
        raise ValueError("permute needs 0 <= position < n")
    key = np.broadcast_to(hash_keys(seed, *keys), position.shape)
    bits = np.ceil(np.log2(np.maximum(n, 2))).astype(np.int64)
    half = np.maximum((bits + 1) // 2, 1).astype(np.uint64)
    mask = (np.uint64(1) << half) - np.uint64(1)
    x = position.astype(np.uint64)
    todo = np.ones(x.shape, dtype=bool)
    while todo.any():
        x[todo] = _feistel(x[todo], key[todo], half[todo], mask[todo])
        todo = x >= n.astype(np.uint64)  # outside [0, n): walk on (cycle walking)
    return x.astype(np.int64)


def _feistel(x: np.ndarray, key: np.ndarray, half: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """One pass of a balanced Feistel network on [0, 4^half): a bijection for fixed keys."""
    left, right = x >> half, x & mask
    for r in range(FEISTEL_ROUNDS):
        f = _mix(key ^ _mix(right + np.uint64(r + 1))) & mask
        left, right = right, left ^ f
    return (left << half) | right
