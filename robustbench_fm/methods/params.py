"""Stage parameters: each stage's parameters are one frozen dataclass (its module's ``PARAMS``)
holding every parameter with the paper's default, the one home of each default. The command
line's stage config is generated from it (:func:`config_node`; interpolations such as
``${seed}`` come from a field's ``metadata["config"]``), the ablations and table builders read it,
and :meth:`StageParams.parse` validates names, types and values once, with one-line errors
naming the override that fixes them.

Each field carries its explanation as an attribute docstring (:func:`field_docs`; the paper section
where the paper sets the value). A parameter of the Python API alone (``metadata=PYTHON_ONLY``)
is left out of the command line's config; a stage sharing a parameter with another declares it
with :func:`shared`, so the default keeps one home."""
from __future__ import annotations

import ast
import copy
import dataclasses
import difflib
import inspect
import numbers
import textwrap
from collections.abc import Mapping, Sequence, Set
from functools import cache
from typing import Any, TypeVar

P = TypeVar("P", bound="StageParams")

#: what an annotation says a parameter takes: a description and a test of a value (integers and
#: numbers include numpy's; lists and mappings what the Python API is given as one)
_KINDS = {
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "int": ("an integer", lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool)),
    "float": ("a number", lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool)),
    "str": ("a string", lambda v: isinstance(v, str)),
    "list": ("a list, e.g. [1,2]", lambda v: _is_list(v)),
    "tuple": ("a list, e.g. [1,2]", lambda v: _is_list(v)),
    "dict": ("a mapping, e.g. {a: 1}", lambda v: isinstance(v, Mapping)),
}


def _is_list(value) -> bool:
    """A list, a tuple, or what a Python caller passes as one (an OmegaConf ListConfig, a range, an
    array), but not a string or a mapping."""
    return (isinstance(value, (Sequence, Set)) or hasattr(value, "__array__")) \
        and not isinstance(value, (str, bytes, Mapping))


@cache
def _kind(annotation: Any) -> tuple[str | None, bool]:
    """(the kind an annotation names, whether None is allowed): ``int | None`` -> ("int", True);
    an annotation naming several kinds or none we know -> (None, True): not checked. Memoised: a
    class's annotations are read on every parse."""
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
        """The parameters of a call or a config, checked: names, types, then :meth:`check`; a
        tuple-typed field holds a tuple whatever sequence it was given (a config's list). An object
        of this class with nothing ``more`` is returned as it is (the plan's, already checked)."""
        if isinstance(params, cls) and not more:
            return params
        given = {**(dataclasses.asdict(params) if isinstance(params, StageParams) else params or {}), **more}
        cls.check_types(given)
        tuples = {f.name for f in dataclasses.fields(cls) if _kind(f.type)[0] == "tuple"}
        out = cls(**{k: tuple(v) if k in tuples and v is not None else v for k, v in given.items()})
        out.check()
        return out

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def config_node(cls: type[StageParams]) -> dict:
    """The ``params`` node of the stage's command-line config: every field's default, or the
    interpolation its ``metadata["config"]`` names (``${seed}``, ``${device}``); fields marked
    :data:`PYTHON_ONLY` are left out."""
    out = {}
    for f in dataclasses.fields(cls):
        if not f.metadata.get("cli", True):
            continue
        if "config" in f.metadata:
            out[f.name] = copy.deepcopy(f.metadata["config"])
        else:
            value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def shared(cls: type[StageParams], name: str) -> Any:
    """A field declared as ``cls`` declares its field ``name`` (default, metadata, docstring), for a
    stage that shares the parameter: its default keeps one home while each stage keeps its own
    field order (the order of its command-line config)."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    metadata = {**f.metadata, "shared_from": cls}
    if f.default is not dataclasses.MISSING:
        return dataclasses.field(default=f.default, metadata=metadata)
    return dataclasses.field(default_factory=f.default_factory, metadata=metadata)


def default(cls: type[StageParams], name: str) -> Any:
    """The default of ``cls``'s field ``name`` (a fresh copy for a mutable one)."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


@cache
def _own_docs(cls: type) -> dict[str, str]:
    """The docstrings that follow the annotated fields in ``cls``'s own body (attribute docstrings,
    as Sphinx reads them)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body
    out = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            out[node.target.id] = inspect.cleandoc(after.value.value)
    return out


def field_docs(cls: type[StageParams]) -> dict[str, str]:
    """Every field's docstring (the class's own, an inherited one, or the one of the stage it is
    :func:`shared` from); "" for a field without one."""
    out = {}
    for f in dataclasses.fields(cls):
        doc = next((_own_docs(k)[f.name] for k in cls.__mro__ if f.name in _own_docs(k)), "")
        if not doc and "shared_from" in f.metadata:
            doc = field_docs(f.metadata["shared_from"]).get(f.name, "")
        out[f.name] = doc
    return out


def as_config(params: StageParams | Mapping) -> dict:
    """The parameters as the stage's config node holds them: a typed object's command-line fields
    (:func:`config_node`'s, in order; a tuple as a list), a mapping (a stage without a parameter
    class) as it is. What the dry run prints and a ``run_job`` stage records (``params.json``)."""
    if not isinstance(params, StageParams):
        return dict(params)
    out = {}
    for f in dataclasses.fields(params):
        if f.metadata.get("cli", True):
            value = getattr(params, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def with_params(fn, params: StageParams | Mapping | None, *args, **kw):
    """``fn(*args, params=params, **kw)``: a stage's ``run`` (and ``check_manifest``) receives the
    typed parameters the plan built as its ``params`` argument, the object itself, parsed once
    (:meth:`StageParams.parse` returns it unchanged). A mapping (a stage without a parameter class)
    goes in as keywords, and so do the fields of a typed object for a function that declares only
    ``**params`` (a plugin written to the earlier contract, which parses them itself)."""
    if params is None:
        return fn(*args, **kw)
    if isinstance(params, StageParams):
        declared = inspect.signature(fn).parameters.get("params")
        if declared is not None and declared.kind is not inspect.Parameter.VAR_KEYWORD:
            return fn(*args, params=params, **kw)
        return fn(*args, **params.to_dict(), **kw)
    return fn(*args, **params, **kw)


#: metadata of a field set from the top-level ``seed`` / ``device`` on the command line
SEED = {"config": "${seed}"}
DEVICE = {"config": "${device}"}
#: metadata of a parameter of the Python API only, not in the command line's config
PYTHON_ONLY = {"cli": False}
