"""core.text.one_line: the one helper the cache, the prepared-image store, extraction and the hub
loader quote an exception's text with."""
import importlib
from pathlib import Path

import pytest

from robustbench_fm.core.text import one_line


def test_whitespace_runs_collapse_to_one_space_and_the_ends_are_stripped():
    assert one_line("  a\n\tb   c\r\n") == "a b c"
    assert one_line(OSError(2, "No such file:\n 'x.parquet'")) == "[Errno 2] No such file: 'x.parquet'"
    assert one_line(KeyError("k")) == "'k'" and one_line("") == "" and one_line(None) == "None"


@pytest.mark.parametrize("text, limit, want", [
    ("abcdef", 6, "abcdef"),          # exactly the limit: unchanged
    ("abcdefg", 6, "abc..."),         # one over: cut to limit - 3 and '...' appended
    ("a  b  c  d", 5, "a ..."),       # the limit counts the collapsed text
    ("abc", None, "abc"),
])
def test_limit_cuts_to_exactly_limit_characters(text, limit, want):
    out = one_line(text, limit)
    assert out == want and (limit is None or len(out) <= limit)


def test_a_limit_too_small_for_the_ellipsis_is_refused():
    with pytest.raises(ValueError, match="limit must be >= 3"):
        one_line("abcdef", 2)


@pytest.mark.parametrize("module", ["robustbench_fm.data.prepared", "robustbench_fm.encoders.loaders.hub",
                                    "robustbench_fm.features.cache", "robustbench_fm.features.engine.rows"])
def test_the_four_call_sites_use_this_one_helper(module):
    mod = importlib.import_module(module)
    assert mod.one_line is one_line
    assert "def _one_line" not in Path(mod.__file__).read_text()
