"""The one place user regexes are compiled, and the cap on the text any regex meets.

Which engine compiles what:

- A user's pattern runs on RE2 (google-re2), whose search time is linear in the text whatever the pattern: the
  `pattern` and `nvtx` of rules files given with --rules and the `pattern` of their [[context]] tables, --kernel,
  --layer-range and --steps nvtx-re:REGEX. Every pattern RE2 accepts is accepted, `(a+)+$` included. A pattern
  RE2 cannot run (a backreference `\\1`, lookaround `(?=`, `(?<!`, a possessive `a++` or atomic `(?>` group, a
  count over 1000, verbose `(?x)`) is one error naming where it came from (a rules file's file:line, or the
  option) and what to write instead. Python's `\\Z` is read as RE2's
  `\\z` (the end of the text) and Python's `{,n}` as `{0,n}`. Where RE2 still reads a pattern that Python also
  accepts differently: `\\d`, `\\w`, `\\s` and `\\b` are ASCII only, and `$` matches only at the very end
  (Python's also before a final newline).
- The shipped patterns (profattr/taxonomy/rules/*.toml, context/*.toml, report/data/*.toml, the code's own) stay on
  Python `re`: ten of them use lookaround, which RE2 has not (`(?<!shared_)experts`, the default --layer-range
  pattern); they are reviewed and tested on real kernel names; and `re` searches a short name about twice as fast
  as RE2 through its Python binding.
- A checkpoint's config.json `re:` ignore patterns are written for an engine that runs them with Python re: RE2 when
  it can run them, else Python re, as the engine does (compile_engine_pattern).

Kernel names and NVTX text are cut to MAX_MATCH_CHARS characters before any rule or user regex meets them
(`capped`): it bounds the shipped patterns' time too, and keeps every engine matching the same text.
"""
from __future__ import annotations

import re
import warnings

import numpy as np
import pandas as pd

from profattr.errors import ProfattrError

try:
    import re2
except ImportError:  # a broken install: said once, when a user pattern is compiled
    re2 = None

MAX_MATCH_CHARS = 4096  # kernel names and NVTX text are matched on their first this many characters
_SURROGATE = re.compile("[\ud800-\udfff]")  # not UTF-8: RE2 cannot take it; U+FFFD, one for one, keeps offsets
_OPTIONS = None
if re2 is not None:
    _OPTIONS = re2.Options()
    _OPTIONS.log_errors = False  # the reason comes back in the exception; RE2 would also print it to stderr


def capped(text) -> str:
    """`text` cut to the MAX_MATCH_CHARS characters a pattern is matched against."""
    text = text if isinstance(text, str) else str(text)
    return text if len(text) <= MAX_MATCH_CHARS else text[:MAX_MATCH_CHARS]


class UserRegex:
    """A user's pattern compiled by RE2, with the part of `re.Pattern` profattr uses: search, match, fullmatch
    (each returns a match with group(), groups(), span(), or None), pattern, groups, groupindex."""

    engine = "re2"
    __slots__ = ("_rx", "pattern")

    def __init__(self, rx, pattern: str):
        self._rx = rx
        self.pattern = pattern

    @property
    def groups(self) -> int:
        return self._rx.groups

    @property
    def groupindex(self) -> dict:
        return dict(self._rx.groupindex)

    def search(self, text: str):
        try:
            return self._rx.search(text)
        except UnicodeEncodeError:  # a lone surrogate (a name that was not valid UTF-8)
            return self._rx.search(_SURROGATE.sub("\ufffd", text))

    def match(self, text: str):
        try:
            return self._rx.match(text)
        except UnicodeEncodeError:
            return self._rx.match(_SURROGATE.sub("\ufffd", text))

    def fullmatch(self, text: str):
        try:
            return self._rx.fullmatch(text)
        except UnicodeEncodeError:
            return self._rx.fullmatch(_SURROGATE.sub("\ufffd", text))

    def __repr__(self) -> str:
        return f"UserRegex({self.pattern!r})"


def _python_spellings_as_re2(pattern: str) -> str:
    """`pattern` with the two spellings Python reads one way and RE2 another written as RE2 reads Python's meaning:
    `\\Z` (the end of the text) as `\\z`, and a count without its lower bound `{,n}` as `{0,n}` (RE2 would read
    it as text). Inside a character class and after a backslash, nothing changes."""
    if "\\Z" not in pattern and "{," not in pattern:
        return pattern
    out, i, in_class, n = [], 0, False, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            out.append("\\z" if pattern[i + 1] == "Z" and not in_class else pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            out.append(c)
            i += 1
            for lead in ("^", "]"):  # `[^]...]` and `[]...]`: a leading `]` is a member
                if i < n and pattern[i] == lead:
                    out.append(lead)
                    i += 1
            continue
        elif c == "{" and pattern.startswith("{,", i):
            close = i + 2
            while close < n and pattern[close].isdigit():
                close += 1
            if close < n and pattern[close] == "}":
                out.append("{0," + pattern[i + 2:close + 1])
                i = close + 1
                continue
        out.append(c)
        i += 1
    return "".join(out)


def _python_reason(pattern: str):
    """Why Python's re also refuses `pattern` (a phrase), or None when it compiles there."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # re's FutureWarnings (a possible nested set)
            re.compile(pattern)
    except re.error as exc:
        return f"{exc.msg} at position {exc.pos}"
    except (RecursionError, OverflowError, ValueError) as exc:
        return str(exc)
    return None


def compile_user(pattern: str, where: str) -> UserRegex:
    """`pattern` compiled by RE2; ProfattrError naming `where` (a rules file's file:line and rule, or an option)
    when it is not a regex at all, or uses what RE2 cannot run."""
    if not isinstance(pattern, str):
        raise ProfattrError(f"{where}: a regex must be a string, got {pattern!r}")
    if re2 is None:
        raise ProfattrError(f"{where}: user patterns run on RE2, and google-re2 is not installed in this Python; "
                            "install it (python3 -m pip install google-re2) or reinstall profattr with its "
                            "dependencies")
    try:
        return UserRegex(re2.compile(_python_spellings_as_re2(pattern), _OPTIONS), pattern)
    except re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) \
            else str(exc)
    except UnicodeEncodeError:
        raise ProfattrError(f"{where}: bad regex {pattern!r}: it is not valid UTF-8 text; write the pattern in "
                            "UTF-8") from None
    python = _python_reason(pattern)
    if python is not None:
        raise ProfattrError(f"{where}: bad regex {pattern!r}: {python}; fix the pattern") from None
    raise ProfattrError(f"{where}: bad regex {pattern!r}: RE2, which runs user regexes in linear time, cannot run it "
                        f"({reason}); rewrite it without backreferences, lookaround (?=, (?!, (?<=, (?<!, possessive "
                        "or atomic groups and counts over 1000") from None


def compile_engine_pattern(pattern: str, where: str):
    """A pattern a checkpoint wrote for an engine that runs it with Python re (a config.json's `re:` ignore
    patterns, which the engine matches against module paths when it loads the weights): on RE2 when RE2 can run it,
    else on Python re as the engine does (the same pattern on the same paths, so no slower than loading the model);
    ProfattrError naming `where` when neither engine compiles it."""
    try:
        return compile_user(pattern, where)
    except ProfattrError:
        if _python_reason(pattern) is not None:
            raise
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return re.compile(pattern)


def search_mask(texts, regex) -> np.ndarray:
    """Per text of `texts` (a sequence or Series of str), whether `regex` (an re.Pattern or a UserRegex) finds a
    match in its first MAX_MATCH_CHARS characters; each distinct text is searched once."""
    codes, distinct = pd.factorize(pd.Series(texts, dtype=object).astype(str), sort=False)
    if not len(distinct):
        return np.zeros(len(codes), dtype=bool)
    hit = np.fromiter((regex.search(capped(t)) is not None for t in distinct), dtype=bool, count=len(distinct))
    return hit[codes]
