"""Command-line options made from a config class: each setting is declared once, in the config.

``@options_from(Config)`` turns ``def command(config: Config, out: ...)`` into a typer command
with one option per field of ``Config``: flag, help and default come from the field
(:func:`~basis_bench.settings.setting`), and the config checks each value where it is made
(its range and choices, one line naming the flag). A command declares only its own extras
(``--out``, ``--force``) and, for a field whose command-line form is not its type, a
:class:`Cli` saying how to read it (a comma-separated list, ``i/N``) or a :class:`Group` of
another config's settings (``evaluate``'s BASIS options). A section the config holds whole
(:func:`~basis_bench.settings.section`: ``oracle``'s generation and grading) gives one option
per setting, by its flat key, and is made from them. A setting's old names
(``setting(was=...)``) stay hidden flags until basis-bench 0.2.0; each use prints a one-line notice.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from basis_bench.errors import InputError
from basis_bench.settings import (
    Key,
    flat_keys,
    made,
    renamed,
    setting_default,
    setting_flag,
    setting_help,
    setting_old_names,
)

_FIELD: Any = object()  # a Cli default meaning "the field's own default"
_KEYWORD = inspect.Parameter.KEYWORD_ONLY
_ANNOTATED: Any = Annotated


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Cli:
    """How one setting reads from the command line where that is not as its field's type."""

    type: Any  # the type typer parses
    parse: Callable[[Any], Any] = _same  # the command-line value -> the field's value
    default: Any = _FIELD  # the command-line default (shown in --help); _FIELD: the field's


def comma(parse: Callable[[str], Any], default: str | None = None) -> Cli:
    """Names given as one comma-separated word (``a,b``); ``default`` is the word shown
    (None: the field's default joined with commas)."""
    return Cli(str, parse, _FIELD if default is None else default)


def repeated(parse: Callable[[Sequence[str]], Any] = tuple) -> Cli:
    """A value given by repeating the flag; ``parse`` gets the items (none when not given)."""
    return Cli(list[str] | None, lambda items: parse(items or ()), None)


@dataclass(frozen=True)
class Group:
    """A field made of some settings of another config (``evaluate``'s ``basis_options`` from
    :class:`~basis_bench.estimators.BasisOptions`' ``--calibration``, ``--eps``, ...), each
    unset by default; ``parse`` gets the ones given as ``{name: value}``. A setting with a
    default of its own gets ``unset`` appended to its help."""

    cls: type
    names: tuple[str, ...]
    parse: Callable[[dict[str, Any]], Any]
    unset: str = ""


@dataclass(frozen=True)
class _Setting:
    """One field of the config: its command-line parameters and how their values make it."""

    name: str
    parameters: tuple[inspect.Parameter, ...]
    read: Callable[[dict[str, Any]], Any]


def options_from(
    cls: type,
    *,
    cli: Mapping[str, Cli | Group] | None = None,
    skip: Sequence[str] = (),
    param: str = "config",
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Make ``command(param: cls, ...extras)`` a command whose options are ``cls``'s settings
    by flat key (but ``skip``), read as ``cli`` says where given; the command's own
    parameters before ``param`` come first in ``--help``, those after it last."""
    cli = cli or {}
    settings = [_field_setting(cls, k, cli.get(k.name)) for k in _fields(cls, skip, cli)]

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        own = list(inspect.signature(command, eval_str=True).parameters.values())
        at = [p.name for p in own].index(param)
        options = [p for s in settings for p in s.parameters]
        params = [p.replace(kind=_KEYWORD) for p in (*own[:at], *options, *own[at + 1 :])]

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            config: Any = made(cls, {s.name: s.read(kwargs) for s in settings})
            extras = {p.name: kwargs[p.name] for p in own if p.name != param}
            return command(**extras, **{param: config})

        run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run

    return decorate


def _fields(cls: type, skip: Sequence[str], cli: Mapping[str, Any]) -> list[Key]:
    """The settings made into options; a name in ``skip`` or ``cli`` that is none is a bug."""
    keys = flat_keys(cls)
    unknown = (set(skip) | set(cli)) - set(keys)
    if unknown:
        raise TypeError(f"{cls.__name__} has no setting(s) {', '.join(sorted(unknown))}")
    return [k for k in keys.values() if k.name not in skip]


def _field_setting(cls: type, key: Key, spec: Cli | Group | None) -> _Setting:
    if isinstance(spec, Group):
        return _group_setting(key.name, spec)
    kind = typing.get_type_hints(key.owner)[key.field]
    if spec is None:
        if typing.get_origin(kind) is dict:
            raise TypeError(f"{cls.__name__}.{key.name}: say how the command line gives it (Cli)")
        spec = repeated() if typing.get_origin(kind) is tuple else Cli(kind)
    default = spec.default
    if default is _FIELD:
        default = setting_default(cls, key.name)
        if spec.type is str and isinstance(default, tuple):
            default = ",".join(default)
    if default is dataclasses.MISSING:
        default = inspect.Parameter.empty  # a required option
    flag = setting_flag(cls, key.name)
    option = typer.Option(flag, help=setting_help(cls, key.name))
    main = inspect.Parameter(
        key.name, _KEYWORD, default=default, annotation=Annotated[spec.type, option]
    )
    olds = [(old, "--" + old.replace("_", "-")) for old in setting_old_names(cls, key.name)]
    hidden = tuple(
        inspect.Parameter(
            f"was_{old}",
            _KEYWORD,
            default=None,
            annotation=Annotated[
                spec.type | None,
                typer.Option(old_flag, hidden=True, callback=_old_flag(key.name, old_flag, flag)),
            ],
        )
        for old, old_flag in olds
    )

    def read(kwargs: dict[str, Any]) -> Any:
        value = kwargs[key.name]
        for old, old_flag in olds:
            given = kwargs[f"was_{old}"]
            if given is not None and given != value:  # the new flag given too
                raise InputError(f"{old_flag} and {flag} are the same setting; give {flag}")
        return spec.parse(value)

    return _Setting(key.name, (main, *hidden), read)


def _old_flag(name: str, old_flag: str, flag: str) -> Callable[..., Any]:
    """The hidden old flag's callback: a notice, and its value becomes the new option's
    default (click reads an option it did not see from ``default_map``; a required one is
    then given)."""

    def callback(ctx: typer.Context, value: Any) -> Any:
        if value is not None:
            renamed(old_flag, flag.split("/")[0])
            ctx.default_map = {**(ctx.default_map or {}), name: value}
        return value

    return callback


def _group_setting(name: str, group: Group) -> _Setting:
    hints = typing.get_type_hints(group.cls)
    parameters = []
    for sub in group.names:
        own_default = setting_default(group.cls, sub) is not None
        text = setting_help(group.cls, sub) + (group.unset if own_default else "")
        option = typer.Option(setting_flag(group.cls, sub), help=text)
        kind = _ANNOTATED[hints[sub] | None, option]  # a type known only here
        parameters.append(inspect.Parameter(sub, _KEYWORD, default=None, annotation=kind))

    def read(kwargs: dict[str, Any]) -> Any:
        return group.parse({k: kwargs[k] for k in group.names if kwargs[k] is not None})

    return _Setting(name, tuple(parameters), read)
