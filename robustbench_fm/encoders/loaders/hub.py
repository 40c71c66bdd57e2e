"""Hugging Face hub access shared by the loaders: offline detection, cache lookup, commit
resolution, ``hub:<hub_id>@<commit>`` weights ids and one-line errors for weights that cannot
be obtained.

Offline (``HF_HUB_OFFLINE=1``) a hub entry is looked up in the local cache before any library
call (:func:`require_cached`), so a missing checkpoint fails at once with one line naming the
hub id (and its gating) instead of retrying the network.
"""
from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from ...core.errors import UserError
from ...core.text import one_line
from ..spec import EncoderSpec, check_remote_code

_TRUE = {"1", "on", "yes", "true"}
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


class WeightsUnavailableError(UserError, RuntimeError):
    """The hub weights of an entry cannot be obtained (offline, gated, network)."""


def offline() -> bool:
    """True when the Hugging Face hub must not be contacted (env var or huggingface_hub flag)."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in _TRUE:
            return True
    try:
        from huggingface_hub import constants
        return bool(constants.HF_HUB_OFFLINE)
    except Exception:  # pragma: no cover - huggingface_hub is a dependency of all three libraries
        return False


def _hub_cache_dir() -> Path:
    from huggingface_hub import constants
    return Path(constants.HF_HUB_CACHE)


def _repo_cache(repo_id: str) -> Path:
    return _hub_cache_dir() / ("models--" + repo_id.replace("/", "--"))


def cached_commit(repo_id: str, revision: str | None = None) -> str | None:
    """Commit hash the local HF cache has for ``repo_id@revision`` (None when not cached)."""
    root = _repo_cache(repo_id)
    rev = revision or "main"
    if _COMMIT.match(rev):
        return rev if (root / "snapshots" / rev).is_dir() else None
    ref = root / "refs" / rev
    if ref.is_file():
        commit = ref.read_text().strip()
        if (root / "snapshots" / commit).is_dir():
            return commit
    return None


def hub_weights_id(hub_id: str, repo_id: str | None, revision: str | None) -> str:
    """``hub:<hub_id>@<commit>``: the pinned commit, else the one the local cache resolved the ref
    to, else the ref itself."""
    rev = revision or "main"
    if not _COMMIT.match(rev) and repo_id:
        rev = cached_commit(repo_id, revision) or rev
    return f"hub:{hub_id}@{rev}"


def _gated_note(spec: EncoderSpec, repo_id: str | None) -> str:
    if not spec.gated:
        return ""
    where = f" at https://huggingface.co/{repo_id}" if repo_id else ""
    return (f" (gated: request access{where}, then pass a token with HF_TOKEN=<token> "
            "or `hf auth login`)")


def missing_offline_error(spec: EncoderSpec, repo_id: str | None) -> WeightsUnavailableError:
    """One line: the entry's weights are not in the local cache and the hub is off limits."""
    repo = f" (HF repo '{repo_id}')" if repo_id and repo_id != spec.hub_id else ""
    return WeightsUnavailableError(
        f"encoder '{spec.name}': weights for hub id '{spec.hub_id}'{repo} are not in the local "
        f"Hugging Face cache and HF_HUB_OFFLINE is set{_gated_note(spec, repo_id)}; "
        "download it and pass encoder.weights=<folder>")


def hub_failure_error(spec: EncoderSpec, repo_id: str | None, err: BaseException) -> WeightsUnavailableError:
    """One line: a library's download/cache call for the entry failed with ``err``."""
    where = "offline (HF_HUB_OFFLINE is set)" if offline() else "from the hub"
    return WeightsUnavailableError(
        f"encoder '{spec.name}': could not load weights for hub id '{spec.hub_id}' {where}"
        f"{_gated_note(spec, repo_id)}: {type(err).__name__}: {one_line(err, 200)}; "
        "download it and pass encoder.weights=<folder>")


def hub_errors() -> tuple[type[BaseException], ...]:
    """Exception types a hub download or cache lookup raises (for ``except`` clauses)."""
    errs: list[type[BaseException]] = [OSError, ConnectionError, TimeoutError]
    try:
        from huggingface_hub import errors as hf_errors
        errs += [getattr(hf_errors, n) for n in (
            "HfHubHTTPError", "LocalEntryNotFoundError", "OfflineModeIsEnabled", "EntryNotFoundError",
            "RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError") if hasattr(hf_errors, n)]
    except ImportError:  # pragma: no cover
        pass
    try:
        import httpx
        errs.append(httpx.HTTPError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(errs)


@contextlib.contextmanager
def hub_call(spec: EncoderSpec, repo_id: str | None):
    """Turn the libraries' download/cache failures into one clear line."""
    try:
        yield
    except WeightsUnavailableError:
        raise
    except hub_errors() as err:
        raise hub_failure_error(spec, repo_id, err) from err


def require_cached(spec: EncoderSpec, repo_id: str | None) -> None:
    """Offline: fail now, naming the hub id, when the repo is not in the local cache."""
    if offline() and (repo_id is None or cached_commit(repo_id, spec.revision) is None):
        raise missing_offline_error(spec, repo_id)


def trust_remote_code(spec: EncoderSpec, allow_remote_code: bool) -> bool:
    """Whether to run the entry's hub code; raises when it needs that code and it is not allowed
    (:func:`~robustbench_fm.encoders.spec.check_remote_code`)."""
    return check_remote_code(spec, allow_remote_code)
