"""Stage-parameter validation: ``methods/params.py`` against pydantic v2 and Hydra structured
configs (OmegaConf), on CANDOR's parameters (issue 43, item 5).

The same class three ways: ``CandorParams`` as it is (a frozen dataclass, ``StageParams.parse``);
a pydantic ``BaseModel`` written from its source (the same fields, defaults and attribute
docstrings; ``extra="forbid"``, ``frozen``, ``use_attribute_docstrings``, ``ge=1`` on k), lax and
strict; ``OmegaConf.structured(CandorParams)`` merged with the input, as a Hydra structured
config validates it. For each: the exact message of the same bad inputs, whether the inputs
today's tests accept are accepted, the import time (fresh interpreter, median of 5), the time to
validate a good input, and the time to define the class (pydantic builds its schema then).

    python scripts/bench_params.py --out benchmarks/cpu2/params.json
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib.util
import inspect
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from robustbench_fm.methods.candor.params import CandorParams  # noqa: E402
from robustbench_fm.methods.params import yaml_value  # noqa: E402

#: the same bad inputs for each (what today's tests/methods/test_params.py and tests/cli assert)
BAD = {
    "wrong type (k=abc)": {"k": "abc"},
    "wrong type (k=true)": {"k": True},
    "unknown key / typo (kk=3)": {"kk": 3},
    "out of range (k=0)": {"k": 0},
    "missing (a required field left out)": "missing",
}
#: inputs today's parse accepts as Python callers pass them (must stay accepted, unchanged)
GOOD = {"numpy int (k=np.int64(7))": {"k": np.int64(7)}, "plain (k=7, n_boot=100)": {"k": 7, "n_boot": 100}}
#: inputs today's parse refuses that a lax validator might coerce
COERCED = {"k='7'": {"k": "7"}, "k=7.0": {"k": 7.0}}


def pydantic_source() -> str:
    """CandorParams' class body as a pydantic model: fields, defaults, docstrings, no check()."""
    src = inspect.getsource(CandorParams)
    body = src.split('    STAGE = "candor"\n', 1)[1].split("    def check", 1)[0]
    body = re.sub(r"field\(default=([^,]+), metadata=\w+\)", r"\1", body)
    body = body.replace("k: int = 5\n", "k: int = Field(5, ge=1)\n", 1)
    head = ("from typing import Any\nfrom pydantic import BaseModel, ConfigDict, Field\n\n\n"
            "class CandorModel(BaseModel):\n"
            "    model_config = ConfigDict(extra='forbid', frozen=True, use_attribute_docstrings=True,\n"
            "                              strict={strict})\n")
    return head + body


# --- the glue pydantic needs to print today's one-line messages (counted in the report) -------- glue:start
_WHAT = {"int": "an integer", "bool": "true or false", "float": "a number", "string": "a string",
         "list": "a list, e.g. [1,2]", "tuple": "a list, e.g. [1,2]", "dict": "a mapping, e.g. {a: 1}"}


def pydantic_one_line(stage: str, model, err) -> str:
    """A pydantic ValidationError as params.py's one line (the first error)."""
    e, fields = err.errors()[0], model.model_fields
    key = str(e["loc"][0])
    if e["type"] == "extra_forbidden":
        close = difflib.get_close_matches(key, fields, n=1)
        return (f"{stage}: unknown parameter stage.params.{key}"
                + (f"; did you mean {close[0]}?" if close else f"; known: {', '.join(fields)}"))
    if e["type"] == "missing":
        return f"{stage}: stage.params.{key} is required"
    if e["type"] == "greater_than_equal":
        return f"{stage}: {key}={e['input']} must be at least {e['ctx']['ge']}"
    f = fields[key]
    nullable = "None" in str(f.annotation)
    return (f"{stage}: stage.params.{key}={yaml_value(e['input'])} must be {_WHAT[e['type'].split('_')[0]]}"
            f"{' or null' if nullable else ''} (default: {yaml_value(f.get_default(call_default_factory=True))})")
# ------------------------------------------------------------------------------------------------- glue:end


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    t = time.perf_counter()
    spec.loader.exec_module(mod)
    return mod, time.perf_counter() - t


def outcome(fn) -> str:
    try:
        out = fn()
    except Exception as err:  # noqa: BLE001 - the message is what is measured
        return f"{type(err).__name__}: {err}"
    return f"accepted: k={getattr(out, 'k', None)!r}"


def import_seconds(stmt: str, repeats: int = 5) -> float:
    code = f"import time; t = time.perf_counter(); {stmt}; print(time.perf_counter() - t)"
    runs = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                 cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}).stdout)
            for _ in range(repeats)]
    return statistics.median(runs)


def own_import_ms(module: str, repeats: int = 5) -> float:
    """The module's own import (``-X importtime``: the line of its body, with whatever it imports
    that was not imported before), median over fresh interpreters."""
    runs = []
    for _ in range(repeats):
        err = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], capture_output=True,
                             text=True, check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
                             ).stderr
        rows = [line.split("|") for line in err.splitlines() if line.rstrip().endswith(" " + module)]
        body = max(rows, key=lambda r: int(r[0].split(":")[1]))  # the line with the module's own body (most self)
        runs.append(int(body[1]) / 1e3)
    return statistics.median(runs)


def per_call(fn, n: int = 2000) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import pydantic  # noqa: F401 - imported before the classes are timed (its own import is timed below)

    tmp = Path(tempfile.mkdtemp())
    models = {}
    for label, strict in (("lax", False), ("strict", True), ("lax, a second class", False)):
        path = tmp / f"candor_pydantic_{len(models)}.py"
        path.write_text(pydantic_source().replace("{strict}", str(strict)))
        mod, seconds = load_module(path, path.stem)
        models[label] = (mod.CandorModel, seconds)
    # "missing": every parameter has the paper's default today; a field without one, added for the test
    Required = dataclasses.make_dataclass("Required", [("extra_required", int, dataclasses.field(kw_only=True))],
                                          bases=(CandorParams,), frozen=True)

    def required_model(strict):
        from pydantic import ConfigDict
        return type("RequiredModel", (models[strict][0],), {"__annotations__": {"extra_required": int},
                                                              "model_config": ConfigDict(extra="forbid")})

    schema = OmegaConf.structured(CandorParams)

    def glued(strict, v):
        from pydantic import ValidationError
        model = required_model(strict) if v == "missing" else models[strict][0]
        try:
            return model() if v == "missing" else model(**v)
        except ValidationError as err:
            raise ValueError(pydantic_one_line("candor", model, err)) from None
    impl = {
        "params.py (today)": lambda v: (Required.parse({}) if v == "missing" else CandorParams.parse(v)),
        "pydantic lax": lambda v: (required_model("lax")() if v == "missing" else models["lax"][0](**v)),
        "pydantic strict": lambda v: (required_model("strict")() if v == "missing" else models["strict"][0](**v)),
        "pydantic lax + glue": lambda v: glued("lax", v),
        "pydantic strict + glue": lambda v: glued("strict", v),
        "Hydra structured (OmegaConf)": lambda v: OmegaConf.to_object(OmegaConf.merge(
            OmegaConf.structured(Required) if v == "missing" else schema, {} if v == "missing" else v)),
    }
    result = {"inputs": {}, "timing": {}}
    for name, fn in impl.items():
        result["inputs"][name] = {label: outcome(lambda v=v: fn(v)) for label, v in {**BAD, **GOOD, **COERCED}.items()}
    good = {"k": 7, "n_boot": 100}
    result["timing"]["validate_us"] = {name: round(per_call(lambda fn=fn: fn(good)) * 1e6, 1)
                                       for name, fn in impl.items()}
    result["timing"]["define_class_ms"] = {f"pydantic {k}": round(v[1] * 1e3, 2) for k, v in models.items()}
    result["timing"]["import_ms"] = {
        "robustbench_fm.methods.params (its own body)": round(own_import_ms("robustbench_fm.methods.params"), 1),
        "pydantic (BaseModel)": round(import_seconds("from pydantic import BaseModel, ConfigDict, Field") * 1e3, 1),
        "omegaconf": round(import_seconds("import omegaconf") * 1e3, 1),
    }
    result["docstrings"] = {
        "params.field_docs": __import__("robustbench_fm.methods.params", fromlist=["x"]).field_docs(CandorParams)["k"],
        "pydantic use_attribute_docstrings": models["lax"][0].model_fields["k"].description,
    }
    text = json.dumps(result, indent=1, ensure_ascii=False)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
