"""The tests without the optional extras: a test that needs one is skipped, naming the install
(conftest's hook), and nothing else is."""

from __future__ import annotations


def test_only_a_missing_extra_turns_a_failure_into_a_skip(monkeypatch):
    """conftest's hook skips a test that failed for want of an optional extra's module, and
    only where that module is really absent: any other failure stays one."""
    import conftest

    from basis_bench.guards.extras import EXTRA_OF

    monkeypatch.setitem(EXTRA_OF, "bb_absent_module", "bbx")
    monkeypatch.setitem(EXTRA_OF, "numpy", "bbx")  # installed here
    absent = ModuleNotFoundError("No module named 'bb_absent_module.sub'")
    absent.name = "bb_absent_module.sub"
    assert conftest.missing_extra(absent) == "bbx"
    present = ModuleNotFoundError("No module named 'numpy'")
    present.name = "numpy"
    assert conftest.missing_extra(present) is None
    refusal = "error: this command needs 'bb_absent_module', which the [bbx] extra installs: ..."
    assert conftest.missing_extra(AssertionError(f"assert 'x' in {refusal!r}")) == "bbx"
    assert (
        conftest.missing_extra(AssertionError(refusal.replace("bb_absent_module", "numpy"))) is None
    )
    assert conftest.missing_extra(AssertionError("assert 2 == 1")) is None
