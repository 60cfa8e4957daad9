"""Settings declared once: a config field carries its default, its help and its range.

Every config of the project (training, evaluate, sensitivity, import, oracle, estimator
options) is a frozen dataclass whose fields are made by :func:`setting`. The field's
metadata holds the help text and the checks, so

- the CLI makes its options from the fields (:mod:`basis_bench.cli.from_config`): help,
  flag and default are never typed twice;
- :func:`check_settings` refuses a value outside its declared range or choices, with one
  line that names the setting, in every place a config is made;
- an error names a setting as the user gave it: its flag on the command line, its field
  in the Python API (:func:`setting_label`, :func:`setting_given`, under :func:`naming`);
- :func:`check_scalar` is the one range checker (scikit-learn's ``check_scalar``,
  raising :class:`~basis_bench.errors.InputError`): NaN, bools posing as numbers and
  infinities (unless allowed) are refused, whatever the bounds;
- a renamed setting lists its old names (``was``): :func:`renamed_keys` and the CLI accept
  them until :data:`OLD_NAMES_UNTIL` (then they are removed), each use a one-line
  :class:`RenamedSetting` notice;
- a concern that several commands share (generation, grading) is one frozen dataclass of
  settings, a *section*, that each command's config holds whole in a :func:`section` field:
  it is declared once and passed inward whole. Users still give its settings as flat TOML
  keys and flags of the command (:func:`flat_keys`); :func:`made` nests them, :func:`flat`
  flattens a config back (config.json), :func:`replaced` changes some by their flat names.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import numbers
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Literal, TypeVar

from basis_bench.errors import InputError

T = TypeVar("T")
# The largest seed of every command: torch.manual_seed takes at most 2**64 - 1 (a seed above
# ended in its overflow traceback after the model had loaded), numpy's counters an int64.
MAX_SEED = 2**63 - 1
# The release that removes the old names of renamed settings (``setting(was=...)``): none
# of them was ever released, and the first release keeps them for notebooks and run folders
# made before the renames.
OLD_NAMES_UNTIL = "0.2.0"
_ABSTRACT: dict[type, type] = {int: numbers.Integral, float: numbers.Real}
Boundaries = Literal["both", "left", "right", "neither"]
_UNSET: Any = dataclasses.MISSING


def check_scalar(
    value: Any,
    name: str,
    target_type: type | tuple[type, ...],
    *,
    min_val: float | None = None,
    max_val: float | None = None,
    include_boundaries: Boundaries = "both",
    allow_inf: bool = False,
) -> Any:
    """``value`` if it is a ``target_type`` within [min_val, max_val], else an InputError.

    ``include_boundaries`` says which bounds are closed. A bool is never a number here,
    NaN never lies in a range, and an infinity needs ``allow_inf`` (a float target with no
    finite bound on that side still refuses it unless allowed).
    """
    types = target_type if isinstance(target_type, tuple) else (target_type,)
    numeric = any(t in (int, float) for t in types)
    # numpy's scalars count: int means any Integral, float any Real (an int is a fine float)
    accepted = tuple(_ABSTRACT.get(t, t) for t in types)
    if (numeric and isinstance(value, bool)) or not isinstance(value, accepted):
        wanted = " or ".join("number" if t is float else t.__name__ for t in types if t is not int)
        wanted = wanted or "integer"
        raise InputError(f"{name} must be {_article(wanted)}; got {value!r}")
    if not numeric:
        return value
    # an integer compares exactly: float(10**400) overflowed, and float(2**63) equals
    # float(2**63 - 1), so 2**63 passed a bound of 2**63 - 1
    x: float = int(value) if isinstance(value, numbers.Integral) else float(value)  # type: ignore[arg-type]
    if isinstance(x, float):
        if math.isnan(x):
            raise InputError(f"{name} must be a number, not NaN")
        if math.isinf(x) and not allow_inf:
            raise InputError(f"{name} must be finite; got {value}")
        if 0 < abs(x) < sys.float_info.min:  # subnormal: 1 / x overflows, x * y underflows
            raise InputError(
                f"{name} must be 0 or at least {sys.float_info.min:g} in size; got {value}"
            )
    low_closed = include_boundaries in ("both", "left")
    high_closed = include_boundaries in ("both", "right")
    too_low = min_val is not None and (x < min_val or (x == min_val and not low_closed))
    too_high = max_val is not None and (x > max_val or (x == max_val and not high_closed))
    if too_low or too_high:
        raise InputError(
            f"{name} must be {_interval(min_val, max_val, low_closed, high_closed)}; got {value}"
        )
    return value


def _article(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _interval(low: float | None, high: float | None, low_closed: bool, high_closed: bool) -> str:
    if high is None:
        return f"{'>=' if low_closed else '>'} {low}"
    if low is None:
        return f"{'<=' if high_closed else '<'} {high}"
    return f"in {'[' if low_closed else '('}{low}, {high}{']' if high_closed else ')'}"


def setting(
    default: Any = _UNSET,
    *,
    help: str | Callable[[], str],
    default_factory: Callable[[], Any] | None = None,
    flag: str | None = None,
    min_val: float | None = None,
    max_val: float | None = None,
    include_boundaries: Boundaries = "both",
    allow_inf: bool = False,
    choices: Sequence[Any] | Callable[[], Sequence[Any]] | None = None,
    optional: bool = False,
    was: Sequence[str] = (),
) -> Any:
    """A dataclass field with its help, CLI flag and checks in its metadata.

    ``choices`` may be a callable, read when a config is checked (for registries that
    fill in late); ``help`` too, read when shown (a registry's names). ``optional``: None is allowed besides the checked values. ``was``: the
    setting's old names, still accepted (with a notice) until :data:`OLD_NAMES_UNTIL`.
    """
    metadata = {
        "help": help,
        "flag": flag,
        "min_val": min_val,
        "max_val": max_val,
        "include_boundaries": include_boundaries,
        "allow_inf": allow_inf,
        "choices": choices,
        "optional": optional,
        "was": tuple(was),
    }
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class _Section:
    """The metadata of a :func:`section` field."""

    cls: type
    defaults: Mapping[str, Any]
    keys: Mapping[str, str]
    omit: frozenset[str]


def section(
    cls: type,
    *,
    defaults: Mapping[str, Any] | None = None,
    keys: Mapping[str, str] | None = None,
    omit: Sequence[str] = (),
) -> Any:
    """A dataclass field holding the settings section ``cls`` (a dataclass of :func:`setting`
    fields) whole. Its settings are flat keys and flags of the holder, each by its own name;
    ``keys``: the name this command's users know a setting by where it is another (kept so
    that no user sees a rename); ``defaults``: this command's own defaults for some (help
    and range stay the section's); ``omit``: settings this command does not offer (they keep
    their default). Without a default for each of ``cls``'s required settings the field is
    required too. The holder checks the section's settings (:func:`check_settings`), naming
    each by its flat key."""
    spec = _Section(cls, dict(defaults or {}), dict(keys or {}), frozenset(omit))
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = (set(spec.defaults) | set(spec.keys) | spec.omit) - names
    if unknown:
        raise TypeError(f"{cls.__name__} has no setting(s) {', '.join(sorted(unknown))}")
    metadata = {"section": spec}
    if _missing(spec, {}):
        return dataclasses.field(metadata=metadata)
    return dataclasses.field(
        default_factory=functools.partial(cls, **spec.defaults), metadata=metadata
    )


def _missing(spec: _Section, given: Mapping[str, Any]) -> list[str]:
    """The required settings of a section that neither ``given`` nor the holder's defaults set."""
    return [
        f.name
        for f in dataclasses.fields(spec.cls)
        if f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
        and f.name not in spec.defaults
        and f.name not in given
    ]


@dataclasses.dataclass(frozen=True)
class Key:
    """One setting of a config as users give it: a TOML key, a flag."""

    name: str  # the key
    owner: type  # the class that declares the setting: the config, or a section of it
    field: str  # the setting's field in ``owner``
    section: str | None = None  # the config's field that holds the section; None: its own


_FLAT_KEYS: dict[type, dict[str, Key]] = {}


def flat_keys(cls: type) -> dict[str, Key]:
    """Every setting of config ``cls`` by its flat key, in declaration order, each section's
    settings in its place (less those it omits, under the names its ``keys`` give)."""
    if cls in _FLAT_KEYS:
        return _FLAT_KEYS[cls]
    found: dict[str, Key] = {}
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("section")
        inner = (
            [Key(f.name, cls, f.name)]
            if spec is None
            else [
                Key(spec.keys.get(g.name, g.name), spec.cls, g.name, f.name)
                for g in dataclasses.fields(spec.cls)
                if g.name not in spec.omit
            ]
        )
        for key in inner:
            if key.name in found:
                raise TypeError(f"{cls.__name__}: two settings are given as {key.name!r}")
            found[key.name] = key
    _FLAT_KEYS[cls] = found
    return found


def _section_spec(cls: type, name: str) -> _Section:
    return next(f for f in dataclasses.fields(cls) if f.name == name).metadata["section"]


def nest(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of config ``cls`` from flat ``values``: each section's settings
    made into the section (the holder's defaults for the rest). A key that is no setting
    passes through as it is (``cls`` refuses it)."""
    keys = flat_keys(cls)
    own: dict[str, Any] = {}
    parts: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        key = keys.get(name)
        if key is None or key.section is None:
            own[name] = value
        else:
            parts.setdefault(key.section, {})[key.field] = value
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("section")
        if spec is None or f.name in own:  # absent, or given whole
            if spec is not None and f.name in parts:
                raise TypeError(f"{f.name} is given whole and by its settings; give one")
            continue
        given = parts.get(f.name, {})
        missing = _missing(spec, given)
        if missing:
            raise InputError(f"{', '.join(missing)} must be given")
        if given or f.default_factory is dataclasses.MISSING:
            own[f.name] = spec.cls(**{**spec.defaults, **given})
    return own


def made(cls: type[T], values: Mapping[str, Any]) -> T:
    """Config ``cls`` from flat ``values`` (its own settings and its sections', by key)."""
    return cls(**nest(cls, values))


def setting_value(config: Any, name: str) -> Any:
    """The value of a config's setting by its flat key."""
    key = flat_keys(type(config))[name]
    holder = config if key.section is None else getattr(config, key.section)
    return getattr(holder, key.field)


def flat(config: Any) -> dict[str, Any]:
    """A config's settings by flat key (copies), as config.json and trainer state hold them."""
    return {name: copy.deepcopy(setting_value(config, name)) for name in flat_keys(type(config))}


def replaced(config: T, **changes: Any) -> T:
    """``config`` with some settings changed, named by their flat keys."""
    keys = flat_keys(type(config))
    own: dict[str, Any] = {}
    parts: dict[str, dict[str, Any]] = {}
    for name, value in changes.items():
        key = keys[name]
        if key.section is None:
            own[name] = value
        else:
            parts.setdefault(key.section, {})[key.field] = value
    for name, part in parts.items():
        own[name] = dataclasses.replace(getattr(config, name), **part)
    return dataclasses.replace(config, **own)  # type: ignore[type-var]


def _field(cls: type, name: str) -> dataclasses.Field[Any]:
    key = flat_keys(cls).get(name) if dataclasses.is_dataclass(cls) else None
    if key is not None:
        for f in dataclasses.fields(key.owner):
            if f.name == key.field:
                return f
    raise KeyError(f"{cls.__name__} has no setting {name!r}")


def setting_help(cls: type, name: str) -> str:
    """The help text of one setting."""
    text = _field(cls, name).metadata.get("help", "")
    return str(text() if callable(text) else text)


def setting_default(cls: type, name: str) -> Any:
    """The default of one setting (a default factory is called), in a section the holder's
    own default where it gives one."""
    key = flat_keys(cls)[name]
    if key.section is not None:
        spec = _section_spec(cls, key.section)
        if key.field in spec.defaults:
            return spec.defaults[key.field]
    f = _field(cls, name)
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def setting_flag(cls: type, name: str) -> str:
    """The CLI flag of one setting: its declared ``flag`` or ``--name-with-dashes``."""
    return _field(cls, name).metadata.get("flag") or "--" + name.replace("_", "-")


def setting_old_names(cls: type, name: str) -> tuple[str, ...]:
    """The old names of one setting (``setting(was=...)``), newest first."""
    return tuple(_field(cls, name).metadata.get("was", ()))


_NAMING: ContextVar[Literal["flag", "field"]] = ContextVar("setting_naming", default="flag")


@contextmanager
def naming(style: Literal["flag", "field"]) -> Iterator[None]:
    """Within the block, errors name a setting by ``style``: its CLI flag (the default,
    ``--batch-size``) or its field, the Python API's argument (``batch_size``)."""
    token = _NAMING.set(style)
    try:
        yield
    finally:
        _NAMING.reset(token)


def option_label(flag: str) -> str:
    """How an error names an option it knows by its flag (``--out``): the flag on the
    command line, the argument (``out``) in the Python API (inside ``naming("field")``); a
    name that is no flag (``run_dir``) as it is."""
    if _NAMING.get() == "field" and flag.startswith("--"):
        return flag[2:].replace("-", "_")
    return flag


def option_given(flag: str, value: Any = True) -> str:
    """How the user gives ``value`` to the option ``flag``, as an error's advice: ``--out
    DIR`` (``--force`` for True) on the command line, ``out='DIR'`` (``force=True``) in the
    Python API, and so a name that is no flag (train's ``run_dir='DIR'``)."""
    label = option_label(flag)
    if label.startswith("--"):
        return label if value is True else f"{label} {value}"
    return f"{label}={value if isinstance(value, bool | int | float) else str(value)!r}"


def setting_label(cls: type, name: str) -> str:
    """How an error names setting ``name`` of ``cls`` to whoever set it: the field name
    inside ``naming("field")`` (the Python API), else its CLI flag's first spelling."""
    if _NAMING.get() == "field":
        return name
    return setting_flag(cls, name).split("/")[0]


def setting_given(cls: type, name: str, value: Any) -> str:
    """How the user gives ``value`` to setting ``name``, as an error's advice: ``name=value``
    inside ``naming("field")``, else the flag (``--no-trajectory``, ``--folds 3``)."""
    if _NAMING.get() == "field":
        return f"{name}={value!r}"
    spellings = setting_flag(cls, name).split("/")
    if isinstance(value, bool):
        return spellings[0] if value or len(spellings) == 1 else spellings[1]
    if isinstance(value, (tuple, list)):  # the CLI's comma-separated lists
        value = ",".join(map(str, value))
    return f"{spellings[0]} {value}"


class RenamedSetting(FutureWarning):
    """An old name of a setting was used; it works until :data:`OLD_NAMES_UNTIL`."""


def renamed(old: str, new: str) -> None:
    """The one-line notice for a setting given by its old name."""
    warnings.warn(
        f"{old} is renamed {new}; the old name is removed in basis-bench {OLD_NAMES_UNTIL}",
        RenamedSetting,
        stacklevel=3,
    )


def current_name(cls: type, key: str, label: Callable[[str], str] = str) -> str:
    """``key``, or the current name of the setting of ``cls`` it is an old name of (a notice)."""
    for name in flat_keys(cls):
        if key in setting_old_names(cls, name):
            renamed(label(key), label(name))
            return name
    return key


def renamed_keys(
    cls: type, values: Mapping[str, Any], label: Callable[[str], str] = str
) -> dict[str, Any]:
    """``values`` with every old key of ``cls``'s settings turned into its current name (a
    notice for each); the old and the new name together is an InputError."""
    new_of = {old: name for name in flat_keys(cls) for old in setting_old_names(cls, name)}
    for key in values:
        new = new_of.get(key)
        if new is not None and new in values:
            raise InputError(
                f"{label(key)} and {label(new)} are the same setting; give {label(new)}"
            )
    return {current_name(cls, key, label): value for key, value in values.items()}


def check_setting(cls: type, name: str, value: Any, label: str | None = None) -> Any:
    """Check one value against the declared range or choices of ``cls.name``."""
    f = _field(cls, name)
    meta, label = f.metadata, label or name
    if value is None and meta.get("optional"):
        return value
    choices = meta.get("choices")
    if choices is not None:  # a tuple value is a list of choices, each checked
        allowed = tuple(choices() if callable(choices) else choices)
        for item in value if isinstance(value, tuple) else (value,):
            if item not in allowed:
                raise InputError(
                    f"{label} must be one of {', '.join(map(str, allowed))}; got {item!r}"
                )
        return value
    if meta.get("min_val") is not None or meta.get("max_val") is not None:
        return check_scalar(
            value,
            label,
            float if "float" in str(f.type) else int,
            min_val=meta["min_val"],
            max_val=meta["max_val"],
            include_boundaries=meta["include_boundaries"],
            allow_inf=meta["allow_inf"],
        )
    if f.type in ("bool", bool) and not isinstance(value, bool):
        raise InputError(f"{label} must be true or false; got {value!r}")
    if isinstance(value, float) and math.isnan(value):
        raise InputError(f"{label} must be a number, not NaN")
    return value


def check_settings(config: Any, label: Callable[[str], str] | None = None) -> None:
    """Check every setting of a config made by :func:`setting`, its sections' too, each
    named by its flat key (call from ``__post_init__``)."""
    cls = type(config)
    for name in flat_keys(cls):
        if "help" in _field(cls, name).metadata:
            check_setting(cls, name, setting_value(config, name), label(name) if label else None)
