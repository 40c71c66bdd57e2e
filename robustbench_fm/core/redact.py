"""Keep secrets (hub tokens, passwords, API keys) out of saved configs and logs."""
from __future__ import annotations

import logging
import re

from omegaconf import DictConfig, ListConfig, OmegaConf

MASK = "***"
#: Config keys whose values are secrets, whatever their nesting: a key one of whose words (split at
#: ``_``, ``-``, ``.`` or a case change) is a secret's name, or whose last word is ``token`` (``token``,
#: ``hf_token``, ``hubToken``). A setting that merely mentions tokens (SPAR's ``token_grid``,
#: ``max_tokens``) is a setting, kept as it is: config.yaml must re-run the experiment.
SECRET_WORDS = frozenset({"secret", "secrets", "password", "passwd", "credential", "credentials", "apikey"})
KEY_OWNERS = frozenset({"api", "secret", "private", "access"})


def key_words(key: str) -> list[str]:
    """The words of a config key, lower case: ``hf_token`` -> [hf, token], ``apiKey`` -> [api, key]."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", str(key))
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def is_secret_key(key) -> bool:
    """Whether config key ``key`` names a secret (:data:`SECRET_WORDS`, a last word ``token``, or
    ``<api|secret|private|access> key`` as its last two words)."""
    words = key_words(str(key))
    if not words:
        return False
    if SECRET_WORDS.intersection(words) or words[-1] == "token":
        return True
    return words[-1] == "key" and len(words) > 1 and words[-2] in KEY_OWNERS
#: Secret-looking strings anywhere in a message: Hugging Face tokens, bearer headers, key=value.
SECRET_TEXT = re.compile(
    r"(hf_[A-Za-z0-9]{20,})"
    r"|(?i:(bearer\s+)[A-Za-z0-9._\-]{16,})"
    r"|(?i:((?:token|secret|password|api_?key)\s*[=:]\s*)[^\s,;'\"]+)")


def redact_text(text: str) -> str:
    """``text`` with every secret-looking substring replaced by ``***``."""
    def sub(m: re.Match) -> str:
        prefix = m.group(2) or m.group(3) or ""
        return prefix + MASK
    return SECRET_TEXT.sub(sub, text)


def redact_config(cfg) -> dict | list:
    """A plain container copy of ``cfg`` (resolved) with secret keys and values masked."""
    data = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, (DictConfig, ListConfig)) else cfg

    def walk(node, key=""):
        if isinstance(node, dict):
            return {k: (MASK if is_secret_key(k) and v is not None else walk(v, k))
                    for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, key) for v in node]
        return redact_text(node) if isinstance(node, str) else node
    return walk(data)


def redacted_yaml(cfg) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(redact_config(cfg)))


class RedactingFilter(logging.Filter):
    """A handler filter that masks secrets in every formatted record before it is written."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


def install_log_redaction() -> None:
    """Attach :class:`RedactingFilter` to every handler of the root logger (idempotent)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
