"""Stage parameters: each stage's parameters are one frozen dataclass (its module's ``PARAMS``)
holding every parameter with the paper's default, the one home of each default. The command
line's stage config is generated from it (:func:`config_node`; interpolations such as
``${seed}`` come from a field's ``metadata["config"]``), the ablations and table builders read it,
and :meth:`StageParams.parse` validates names, types and values once, with one-line errors
naming the override that fixes them."""
from __future__ import annotations

import dataclasses
import difflib
from typing import Any, TypeVar

P = TypeVar("P", bound="StageParams")

#: what an annotation says a parameter takes: a description and a test of a value
_KINDS = {
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "float": ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    "str": ("a string", lambda v: isinstance(v, str)),
    "list": ("a list, e.g. [1,2]", lambda v: isinstance(v, (list, tuple))),
    "tuple": ("a list, e.g. [1,2]", lambda v: isinstance(v, (list, tuple))),
    "dict": ("a mapping, e.g. {a: 1}", lambda v: isinstance(v, dict)),
}


def _kind(annotation: Any) -> tuple[str | None, bool]:
    """(the kind an annotation names, whether None is allowed): ``int | None`` -> ("int", True);
    an annotation naming several kinds or none we know -> (None, True): not checked."""
    parts = [p.strip() for p in str(annotation).replace("Optional[", "").rstrip("]").split("|")]
    nullable = "None" in parts
    kinds = {p.split("[")[0] for p in parts if p != "None"}
    return (kinds.pop() if len(kinds) == 1 and next(iter(kinds)) in _KINDS else None), nullable


def yaml_value(value) -> str:
    """A value as a command-line override writes it (true, null, [1,2], abc)."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(yaml_value(v) for v in value) + "]"
    return str(value)


@dataclasses.dataclass(frozen=True)
class StageParams:
    """Base of every stage's parameters. Subclasses are frozen dataclasses whose fields carry the
    defaults and override :meth:`check` (value checks, one line each)."""

    #: the stage name used in error messages (a class attribute, not a parameter)
    STAGE = "stage"

    def check(self) -> None:
        """Refuse inconsistent values (one line each); types are checked by :meth:`parse`."""

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def check_types(cls, params: dict) -> None:
        """Unknown names and values of the wrong type, as one line naming ``stage.params.<key>``."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key, value in params.items():
            f = fields.get(key)
            if f is None:
                close = difflib.get_close_matches(key, fields, n=1)
                raise ValueError(f"{cls.STAGE}: unknown parameter stage.params.{key}"
                                 + (f"; did you mean {close[0]}?" if close else f"; known: {', '.join(fields)}"))
            kind, nullable = _kind(f.type)
            if kind is None or (value is None and nullable):
                continue
            what, ok = _KINDS[kind]
            if value is None or not ok(value):
                default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
                raise ValueError(f"{cls.STAGE}: stage.params.{key}={yaml_value(value)} must be {what}"
                                 f"{' or null' if nullable else ''} (default: {yaml_value(default)})")

    @classmethod
    def parse(cls: type[P], params: dict | None = None, **more) -> P:
        """The parameters of a call or a config, checked: names, types, then :meth:`check`."""
        if isinstance(params, cls) and not more:
            return params
        given = {**(dataclasses.asdict(params) if isinstance(params, StageParams) else params or {}), **more}
        cls.check_types(given)
        out = cls(**given)
        out.check()
        return out

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def config_node(cls: type[StageParams]) -> dict:
    """The ``params`` node of the stage's command-line config: every field's default, or the
    interpolation its ``metadata["config"]`` names (``${seed}``, ``${device}``)."""
    out = {}
    for f in dataclasses.fields(cls):
        if "config" in f.metadata:
            out[f.name] = f.metadata["config"]
        else:
            value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


SEED = {"config": "${seed}"}
DEVICE = {"config": "${device}"}
