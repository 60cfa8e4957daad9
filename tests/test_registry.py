"""The one registry idiom (basis_bench.registry): names refused twice, an unknown name
answered with the registered ones, lazy entries, temporary registrations, and third-party
entries found through each extension point's entry point group; figure styling lives with
the figures, keyed by estimator name."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import import_extra

from basis_bench.errors import InputError
from basis_bench.estimators import ESTIMATORS, EstimatorInput
from basis_bench.evaluation.figure_style import STYLES, colours, label, looks
from basis_bench.registry import PluginWarning, Registry
from basis_bench.rollouts.generation import Generation
from basis_bench.rollouts.importers import IMPORTERS, import_sources
from basis_bench.rollouts.sampling.registry import SAMPLERS, backend_names, sampler_class
from basis_bench.settings import setting_help


def _install(site: Path, dist: str, group: str, module: str, source: str) -> None:
    """A minimal installed distribution: ``module`` and a .dist-info declaring it in ``group``."""
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{dist} = {module}\n")


def test_a_name_is_registered_once_and_an_unknown_one_lists_the_registered():
    widgets: Registry[int] = Registry("widget", "bb_test.none")
    widgets.add("one", 1)
    widgets.add("two", 2)
    with pytest.raises(ValueError, match=r"^widget 'one' is already registered$"):
        widgets.add("one", 3)
    assert widgets["one"] == 1 and widgets.get("two") == 2
    with pytest.raises(InputError, match=r"^unknown widget 'three'; registered: one, two$"):
        widgets.get("three")
    assert list(widgets) == ["one", "two"] and widgets.names() == ("one", "two")
    assert "two" in widgets and "three" not in widgets and dict(widgets)["one"] == 1


def _policy_losses() -> Registry:
    """The policy-loss registry: its module holds the losses, torch functions, so a test of it
    is skipped, naming the [hf] extra, where torch is not installed."""
    import_extra("hf", "torch")
    from basis_bench.train.losses import POLICY_LOSSES

    return POLICY_LOSSES


REGISTRIES = {  # each extension point, and a name its package registers
    "estimators": (lambda: ESTIMATORS, "basis"),
    "samplers": (lambda: SAMPLERS, "hf"),
    "policy_losses": (_policy_losses, "grpo"),
    "importers": (lambda: IMPORTERS, "counts"),
}


@pytest.mark.parametrize("point", list(REGISTRIES))
def test_each_extension_point_refuses_a_taken_name_and_lists_its_names(point):
    get, name = REGISTRIES[point]
    registry = get()
    with registry.temporary(), pytest.raises(ValueError, match="already registered"):
        registry.add(name, registry[name])
    with pytest.raises(InputError) as err:
        registry.get("nope")
    assert str(err.value) == (
        f"unknown {registry.kind} 'nope'; registered: {', '.join(registry.names())}"
    )
    assert name in str(err.value)


def test_a_lazy_entry_is_imported_on_first_use_only(tmp_path, monkeypatch):
    (tmp_path / "bb_lazy_target.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    things: Registry[int] = Registry("thing", "bb_test.none")
    things.lazy("answer", "bb_lazy_target:VALUE")
    assert things.names() == ("answer",) and "bb_lazy_target" not in sys.modules
    assert things.get("answer") == 42 and "bb_lazy_target" in sys.modules


def test_temporary_registrations_are_removed_and_the_others_kept():
    POLICY_LOSSES = _policy_losses()
    before = list(POLICY_LOSSES)
    with POLICY_LOSSES.temporary() as losses:
        losses.add("test_tmp", POLICY_LOSSES["gpg"])
        assert list(POLICY_LOSSES) == [*before, "test_tmp"]
    assert list(POLICY_LOSSES) == before


def test_an_unknown_name_loads_the_entry_point_group_first(tmp_path, monkeypatch):
    """A name that is not registered yet is looked for in the installed plug-ins (once per
    process); a plug-in that fails to import is one warning and skipped."""
    site = tmp_path / "site"
    source = """
        from tests_bb_widgets import WIDGETS
        WIDGETS.add("plugged", 7)
    """
    _install(site, "bb_widget_plugin", "bb_test.widgets", "bb_widget_plugin", source)
    _install(site, "bb_widget_broken", "bb_test.widgets", "bb_widget_broken", "import nowhere_x\n")
    widgets: Registry[int] = Registry("widget", "bb_test.widgets")
    module = type(sys)("tests_bb_widgets")
    module.WIDGETS = widgets  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tests_bb_widgets", module)
    monkeypatch.syspath_prepend(str(site))
    widgets.add("own", 1)
    assert list(widgets) == ["own"]  # nothing loaded until asked
    with pytest.warns(PluginWarning, match=r"widget plug-in 'bb_widget_broken' .*nowhere_x"):
        assert widgets.get("plugged") == 7
    assert widgets.names() == ("own", "plugged")
    assert widgets.load_plugins() == []  # once per process


PLUGINS = {
    "basis_bench.estimators": """
        from basis_bench.estimators import register_estimator

        @register_estimator("bb_plugin_half")
        def half(batch):
            \"\"\"One half.\"\"\"
            return batch.rewards * 0 + 0.5
    """,
    "basis_bench.samplers": """
        from basis_bench.rollouts.sampling import register_sampler
        from basis_bench.rollouts.sampling.hf import HFSampler

        class Renamed(HFSampler):
            backend = "bb_plugin_hf"
            summary = "a plug-in's"

        register_sampler(Renamed)
    """,
    "basis_bench.policy_losses": """
        from basis_bench.train.losses import POLICY_LOSSES, register_policy_loss

        register_policy_loss("bb_plugin_gpg")(POLICY_LOSSES["gpg"].fn)
    """,
    "basis_bench.importers": """
        from basis_bench.rollouts.importers import IMPORTERS

        IMPORTERS.lazy("bb-plugin-counts", "basis_bench.rollouts.importers.counts:import_counts")
    """,
}


@pytest.mark.parametrize("group", list(PLUGINS))
def test_each_extension_point_finds_its_installed_plugins(group, tmp_path, monkeypatch):
    point = group.split(".")[1]
    registry = REGISTRIES[point][0]()
    name = {
        "estimators": "bb_plugin_half",
        "samplers": "bb_plugin_hf",
        "policy_losses": "bb_plugin_gpg",
        "importers": "bb-plugin-counts",
    }[point]
    assert registry.group == group
    module = "bb_plugin_" + group.split(".")[1]
    _install(tmp_path, module, group, module, PLUGINS[group])
    monkeypatch.syspath_prepend(str(tmp_path))
    before = list(registry)
    with registry.temporary():
        assert registry.load_plugins(force=True) == [module]
        assert list(registry) == [*before, name]
        if registry is ESTIMATORS:
            out = ESTIMATORS.get(name)(EstimatorInput(np.ones((3, 1))))
            assert np.all(out == 0.5)
        elif registry is SAMPLERS:
            assert sampler_class(name).backend == name and name in backend_names()
            shown = setting_help(Generation, "backend")  # --backend's help, read when shown
            assert "hf (transformers; CPU or GPU)" in shown and f"{name} (a plug-in's)" in shown
        elif point == "policy_losses":
            assert registry.get(name).fn is registry["gpg"].fn
        else:  # the plug-in's format reads a file
            src = tmp_path / "counts.csv"
            src.write_text("prompt_id,n,n_correct\nq1,4,1\nq2,2,2\n")
            got = import_sources(name, [src], "p")
            assert got.rollouts.height == 6 and float(got.rollouts["reward"].sum()) == 3.0
    assert list(registry) == before


def test_every_builtin_estimator_has_a_figure_style_and_others_get_the_default():
    assert set(STYLES) == set(ESTIMATORS)
    assert label("basis_paper") == "BASIS (paper)" and label("grpo", 8) == "GRPO (G=8)"
    assert label("my_$x$") == r"my_\$x\$"  # a name not in the table: its own, never math
    drawn = looks(["basis", "my_$x$"])
    assert drawn["basis"].colour == colours()["basis"] == "#08519c"
    assert drawn["my_$x$"].colour not in colours().values()
