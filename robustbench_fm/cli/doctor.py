"""``python -m robustbench_fm doctor [encoder ...]``: what each encoder needs and whether it can
run offline on this machine now.

Per encoder: the packages its loader imports (found or missing, without importing them), where
its weights are (random/built-in, the local Hugging Face cache, torchxrayvision's cache, inside an
installed Python package (``hub_id="package:<import name>/<file>"``), or outside the hub so
``encoder.weights=PATH`` is needed), whether it is gated and a Hugging Face
token is configured, and whether it needs ``trust_remote_code``. Nothing touches the network.
After the table, one install line per missing package (its robustbench_fm extra, or the authors'
repository for packages that are not on PyPI); packages one command installs share its line.
A generic entry is named ``<kind>:<model>`` (``doctor timm:vit_small_patch16_224``,
``doctor hf:/models/my-vit``, ``doctor open_clip:ViT-B-32@openai``): :func:`diagnose_generic`.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from ..encoders import generic, get, names
from ..encoders.spec import EncoderSpec

#: import name of each library's loader dependency (None: built into robustbench_fm)
_LIBRARY_MODULES = {"timm": "timm", "open_clip": "open_clip", "transformers": "transformers",
                    "torchxrayvision": "torchxrayvision", "synthetic": None, "conch": "timm", "musk": "timm",
                    "flair": "torch", "panderm": "timm", "sam_med2d": "torch", "titan_conch": "transformers",
                    "slide": "transformers"}


@dataclass(frozen=True)
class Diagnosis:
    """One encoder's readiness; ``offline_ok`` is True when it can be loaded offline right now."""

    name: str
    packages_missing: tuple[str, ...]
    weights: str
    weights_found: bool
    gated: bool
    token: bool
    remote_code: bool
    offline_ok: bool

    def cells(self) -> tuple[str, ...]:
        """The doctor's columns for this encoder: name, offline, packages, weights, access."""
        pkgs = "ok" if not self.packages_missing else "missing " + ",".join(self.packages_missing)
        gate = ("gated, token set" if self.token else "gated, NO token") if self.gated else "open"
        return (self.name, "yes" if self.offline_ok else "no", pkgs, self.weights,
                gate + ("  remote code" if self.remote_code else ""))

    def line(self) -> str:
        return "  ".join(self.cells())


def _module_found(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def hub_repo(spec: EncoderSpec) -> str | None:
    """The Hugging Face repo holding the entry's weights (None when they live elsewhere)."""
    hub_id = spec.hub_id
    if hub_id.startswith(("gdrive:", "planted:", "package:")) or spec.library == "torchxrayvision":
        return None
    if ":" in hub_id:
        return hub_id.split(":", 1)[1].split("@")[0]
    if spec.library == "timm" and spec.hub_file is None:
        from ..encoders.loaders.timm_loader import _timm_repo  # lazy: imports torch
        return _timm_repo(hub_id)
    return hub_id


def _hf_token() -> bool:
    from huggingface_hub import get_token
    return bool(get_token())


def _package_weights(spec: EncoderSpec) -> tuple[str, bool]:
    """(where, found) for weights shipped in an installed package, found without importing it."""
    package, _, resource = spec.hub_id.partition(":")[2].partition("/")
    found = importlib.util.find_spec(package) if _module_found(package) else None
    if found is None:
        return f"package {package} not installed", False
    folders = list(found.submodule_search_locations or [])
    if not any((Path(folder) / resource).is_file() for folder in folders):
        return f"package {package} lacks {Path(resource).name}", False
    return f"package {package}", True


def _weights(spec: EncoderSpec) -> tuple[str, bool]:
    """(where the weights are, found) without any network access."""
    if spec.library == "synthetic":
        return "built-in (no weights)", True
    if not spec.pretrained:
        return f"random (seed {spec.seed}, no download)", True
    if spec.hub_id.startswith("package:"):
        return _package_weights(spec)
    if spec.library == "torchxrayvision":
        if not _module_found("torchxrayvision"):  # its cache folder and file names come from the package
            return "unknown: torchxrayvision not installed", False
        from ..encoders.loaders.xrv_loader import cached_release  # lazy: imports torch
        path = cached_release(spec)
        return (f"torchxrayvision cache {path.name[:24]}", True) if path else ("not in torchxrayvision cache", False)
    repo = hub_repo(spec)
    if repo is None:
        return "encoder.weights=PATH needed (not on HF)", False
    from huggingface_hub import try_to_load_from_cache

    from ..encoders.loaders.hub import cached_commit  # lazy: imports torch
    commit = cached_commit(repo, spec.revision)
    if commit is not None and spec.hub_file is not None:
        found = isinstance(try_to_load_from_cache(repo, spec.hub_file, revision=commit), str)
    else:
        found = commit is not None
    return (f"HF cache {repo}@{commit[:8]}", True) if found else (f"not in HF cache ({repo})", False)


def diagnose(name: str) -> Diagnosis:
    """The readiness of one registry entry on this machine (no import of its packages, no network)."""
    spec = get(name)
    modules = list(dict.fromkeys(m for m in (_LIBRARY_MODULES[spec.library], *spec.requires) if m))
    missing = tuple(m for m in modules if not _module_found(m))
    where, found = _weights(spec)
    return Diagnosis(name=name, packages_missing=missing, weights=where, weights_found=found, gated=spec.gated,
                     token=spec.gated and _hf_token(), remote_code=spec.trust_remote_code,
                     offline_ok=not missing and found)


def diagnose_generic(name: str) -> Diagnosis:
    """The readiness of a generic entry named ``<kind>:<model>[@<open_clip tag>]`` (``timm:vit_small_patch16_224``,
    ``hf:/models/my-vit``, ``open_clip:ViT-B-32@openai``): its library, and where the weights the
    kind loads without ``encoder.weights`` are (a local folder, or the Hugging Face cache). Imports
    no model library except open_clip's tag table, opens no connection."""
    kind, _, model = name.partition(":")
    module = generic.GENERIC[kind]
    missing = () if _module_found(module) else (module,)
    model, _, tag = model.partition("@") if kind == "open_clip" else (model, "", "")
    if Path(model).expanduser().is_dir():
        folder = Path(model).expanduser()
        marker = "open_clip_config.json" if kind == "open_clip" else "config.json"
        found = (folder / marker).is_file()
        where = f"local folder {folder.name}" if found else f"local folder without {marker}"
    else:
        repo = None
        if model.startswith(("hf-hub:", "hf_hub:")) or (kind == "hf") or ("/" in model):
            repo = model.split(":", 1)[1] if model.startswith(("hf-hub:", "hf_hub:")) else model
        elif kind == "timm" and not missing:
            from ..encoders.loaders.timm_loader import _timm_repo  # lazy: imports torch and timm
            repo = _timm_repo(model)
        elif kind == "open_clip" and not missing:
            import open_clip  # lazy: the tag table (imports torch)
            cfg = open_clip.get_pretrained_cfg(model, tag) if tag else {}
            repo = (cfg.get("hf_hub") or "").strip("/") or None
        if repo is None:
            where, found = ("encoder.pretrained=<tag> or encoder.weights=PATH needed" if kind == "open_clip"
                            else "encoder.weights=PATH needed (not on HF)"), False
        else:
            from ..encoders.loaders.hub import cached_commit  # lazy: imports torch
            commit = cached_commit(repo)
            found = commit is not None
            where = f"HF cache {repo}@{commit[:8]}" if found else f"not in HF cache ({repo})"
    return Diagnosis(name=name, packages_missing=missing, weights=where, weights_found=found, gated=False,
                     token=False, remote_code=False, offline_ok=not missing and found)


def _install_line():
    from ..encoders.loaders.extras import install_line  # lazy: the loaders package imports torch

    return install_line


def install_lines(rows: list[Diagnosis]) -> list[str]:
    """One line per install command the missing packages of ``rows`` need: the command, then the
    packages it installs and the encoders that need them (a package several extras hold, e.g.
    fairscale, is listed under each entry's own command)."""
    commands: dict[str, tuple[dict, dict]] = {}
    for row in rows:
        if ":" in row.name:  # a generic entry's library is a core dependency of robustbench_fm
            continue
        for module in row.packages_missing:
            packages, encoders = commands.setdefault(_install_line()(get(row.name), module), ({}, {}))
            packages[module] = encoders[row.name] = None
    if not commands:
        return []
    width = max(len(c) for c in commands)
    return ["missing packages, one install line each:"] + [
        f"  {command:{width}s}  # {', '.join(packages)} (for {', '.join(encoders)})"
        for command, (packages, encoders) in commands.items()]


def report(selected: list[str] | None = None) -> str:
    """The doctor's table: one line per encoder (all registered ones by default), a summary and
    the install line of every missing package. An unknown name raises KeyError (one line, with
    the registry's closest names) before any output."""
    chosen = selected or names()
    for name in chosen:
        if name.partition(":")[0] in generic.GENERIC and name.partition(":")[2]:
            continue
        if name in generic.GENERIC:
            raise KeyError(f"'{name}' is a generic encoder: name its model, doctor {name}:<model>")
        get(name)  # unknown names fail with the registry's suggestion before any output
    rows = [diagnose_generic(n) if n.partition(":")[0] in generic.GENERIC else diagnose(n) for n in chosen]
    ready = sum(r.offline_ok for r in rows)
    table = [("encoder", "offline", "packages", "weights", "access"), *(r.cells() for r in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    lines = ["  ".join([c.ljust(w) for c, w in zip(row, widths)] + [row[-1]]) for row in table]
    return "\n".join(lines + [f"{ready} of {len(rows)} encoders can run offline now; "
                               "pass encoder.weights=PATH for the others"]
                     + install_lines(rows))
