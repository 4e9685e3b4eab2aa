"""User regexes, bounded before they meet a capture's names: the `pattern` and `nvtx` of rules files given with
--rules, --layer-range and --steps nvtx-re:REGEX. Python's `re` backtracks, so a pattern such as `(a+)+$` takes
exponential time on a long name that almost matches, and would hang `budget` and `classify`.

Two checks, when a user pattern is compiled (the shipped rules are reviewed and tested instead):

1. static: a quantifier that repeats without bound (or ten times or more) whose body holds another quantifier of
   variable length (`(a+)+`, `(\\w+_?)*`, `(?:a|b*){2,}`) is refused: it can match one text in exponentially many
   ways. Optional parts (`?`), fixed counts (`{3}`) and possessive or atomic groups (`a++`, `(?>...)`) are fine;
2. a trial: the pattern is searched in adversarial names built from its own characters (each repeated to
   MAX_MATCH_CHARS, then a character it does not expect, where backtracking is worst), each within TRIAL_SECONDS.
   The trial is bounded by a timer signal (SIGALRM) in the main thread, else run in a child Python process that
   is stopped the same way (and killed when even that fails). A pattern that overruns is refused: polynomial
   blow-ups such as `.*a.*b` (cubic: 20 s on 4096 characters) that the static check does not see; a quadratic
   one (`.*_fp8_.*gemm`, ~0.1 s) passes.

Either refusal names the rules file and line (or the option) and the pattern. Kernel names and NVTX text are cut
to MAX_MATCH_CHARS characters before any rule or user regex matches them (`capped`), so the trial's length is the
longest text a pattern ever meets.
"""
from __future__ import annotations

import functools
import json
import re
import signal
import subprocess
import sys
import threading
import warnings

from profattr.errors import ProfattrError

try:  # Python 3.11+
    from re import _constants as _sre_constants
    from re import _parser as _sre_parse
except ImportError:  # pragma: no cover - Python < 3.11
    import sre_constants as _sre_constants  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

MAX_MATCH_CHARS = 4096  # kernel names and NVTX text are matched on their first this many characters
TRIAL_SECONDS = 0.25  # per trial name: a quadratic pattern takes ~0.1 s on 4096 characters, a cubic one ~20 s
UNBOUNDED_REPEATS = 10  # a quantifier that may repeat this often is treated as unbounded
_MAXREPEAT = _sre_constants.MAXREPEAT
_REPEATS = {_sre_constants.MAX_REPEAT, _sre_constants.MIN_REPEAT}
_POSSESSIVE = getattr(_sre_constants, "POSSESSIVE_REPEAT", None)
_ATOMIC = getattr(_sre_constants, "ATOMIC_GROUP", None)
_CATEGORY_CHARS = {"DIGIT": "0", "NOT_DIGIT": "a", "SPACE": " ", "NOT_SPACE": "a", "WORD": "a", "NOT_WORD": "-"}


def capped(text) -> str:
    """`text` cut to the MAX_MATCH_CHARS characters a pattern is matched against."""
    text = text if isinstance(text, str) else str(text)
    return text if len(text) <= MAX_MATCH_CHARS else text[:MAX_MATCH_CHARS]


def _unbounded(hi) -> bool:
    return hi >= UNBOUNDED_REPEATS  # MAXREPEAT (no bound) included


def _nested(items, under_repeat: bool):
    """The first nested variable-length quantifier inside an unbounded one, as text, else None."""
    for op, av in items:
        if op in _REPEATS:
            lo, hi, sub = av
            if under_repeat and lo != hi and (hi is _MAXREPEAT or hi > 1):
                return "repeats a part that is itself repeated a variable number of times"
            found = _nested(sub, under_repeat or _unbounded(hi))
        elif _POSSESSIVE is not None and op == _POSSESSIVE:
            found = _nested(av[2], False)  # matched once, never backtracked into
        elif _ATOMIC is not None and op == _ATOMIC:
            found = _nested(av, False)
        elif op == _sre_constants.SUBPATTERN:
            found = _nested(av[-1], under_repeat)
        elif op == _sre_constants.BRANCH:
            found = next((f for sub in av[1] if (f := _nested(sub, under_repeat))), None)
        elif op in (_sre_constants.ASSERT, _sre_constants.ASSERT_NOT):
            found = _nested(av[1], under_repeat)
        elif op == _sre_constants.GROUPREF_EXISTS:
            found = next((f for sub in av[1:] if sub is not None and (f := _nested(sub, under_repeat))), None)
        else:
            found = None
        if found:
            return found
    return None


def _characters(items, out: list) -> None:
    """Characters the pattern matches, in order of appearance (to build its trial names)."""
    for op, av in items:
        if op == _sre_constants.LITERAL:
            out.append(chr(av))
        elif op == _sre_constants.NOT_LITERAL:
            out.append("a" if chr(av) != "a" else "b")
        elif op == _sre_constants.ANY:
            out.append("a")
        elif op == _sre_constants.IN:
            for kind, value in av:
                if kind == _sre_constants.LITERAL:
                    out.append(chr(value))
                elif kind == _sre_constants.RANGE:
                    out += [chr(value[0]), chr(value[1])]
                elif kind == _sre_constants.CATEGORY:
                    out.append(_CATEGORY_CHARS.get(str(value).replace("CATEGORY_", ""), "a"))
        elif op in _REPEATS or (_POSSESSIVE is not None and op == _POSSESSIVE):
            _characters(av[2], out)
        elif _ATOMIC is not None and op == _ATOMIC:
            _characters(av, out)
        elif op == _sre_constants.SUBPATTERN:
            _characters(av[-1], out)
        elif op == _sre_constants.BRANCH:
            for sub in av[1]:
                _characters(sub, out)
        elif op in (_sre_constants.ASSERT, _sre_constants.ASSERT_NOT):
            _characters(av[1], out)


def trial_names(pattern: str) -> list:
    """Adversarial names for `pattern`: each of its characters, the first pairs in order, and all of them in order,
    repeated to MAX_MATCH_CHARS, then a character it does not expect."""
    chars: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _characters(_sre_parse.parse(pattern), chars)
    chars = [c for c in dict.fromkeys(chars) if c][:8] or ["a"]
    units = chars + [a + b for a, b in zip(chars, chars[1:])][:4] + ["".join(chars)]
    return [(unit * (MAX_MATCH_CHARS // len(unit) + 1))[: MAX_MATCH_CHARS - 1] + "\x00" for unit in units]


class _Overrun(Exception):
    pass


def _raise_overrun(signum, frame):
    raise _Overrun()


_CHILD = r"""
import json, re, signal, sys, time
pattern, names, limit = json.loads(sys.stdin.read())
def stop(*a):
    sys.stdout.write("slow"); sys.stdout.flush(); sys.exit(0)
signal.signal(signal.SIGALRM, stop)
rx = re.compile(pattern)
for n in names:
    signal.setitimer(signal.ITIMER_REAL, limit)
    rx.search(n)
    signal.setitimer(signal.ITIMER_REAL, 0)
sys.stdout.write("ok")
"""


def _main_thread_timer_free() -> bool:
    return (threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
            and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0))


def _overruns(pattern: str, names: list) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rx = re.compile(pattern)
    if _main_thread_timer_free():
        previous = signal.signal(signal.SIGALRM, _raise_overrun)
        try:
            for name in names:
                signal.setitimer(signal.ITIMER_REAL, TRIAL_SECONDS)
                rx.search(name)
                signal.setitimer(signal.ITIMER_REAL, 0)
            return False
        except _Overrun:
            return True
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    # not the main thread (a signal cannot be used here): a child process, killed when even its timer fails
    try:
        done = subprocess.run([sys.executable, "-I", "-S", "-c", _CHILD], input=json.dumps([pattern, names,
                                                                                            TRIAL_SECONDS]),
                              capture_output=True, text=True, timeout=TRIAL_SECONDS * len(names) + 10)
    except subprocess.TimeoutExpired:
        return True
    except OSError:  # no child process here: the static check stands alone
        return False
    return done.stdout.strip() == "slow"


@functools.lru_cache(maxsize=512)
def problem(pattern: str):
    """Why `pattern` is refused (a phrase), or None. `pattern` must compile."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parsed = _sre_parse.parse(pattern)
    nested = _nested(parsed, False)
    if nested:
        return f"{nested} (catastrophic backtracking: exponential time on a long name)"
    if _overruns(pattern, trial_names(pattern)):
        return (f"took over {TRIAL_SECONDS:g} s to search a {MAX_MATCH_CHARS}-character trial name (it backtracks "
                "too much)")
    return None


def compile_user(pattern: str, where: str) -> "re.Pattern[str]":
    """`pattern` compiled, after the checks of the module docstring; ProfattrError naming `where` (a rules file's
    file:line and rule, or an option) when it does not compile or is refused."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # re's FutureWarnings (a possible nested set): the user's choice
            rx = re.compile(pattern)
    except re.error as exc:
        raise ProfattrError(f"{where}: bad regex {pattern!r}: {exc.msg} at position {exc.pos}; write a Python re "
                            "pattern") from None
    except (RecursionError, OverflowError, ValueError) as exc:
        raise ProfattrError(f"{where}: bad regex {pattern!r}: {exc}; write a simpler pattern") from None
    why = problem(pattern)
    if why:
        raise ProfattrError(f"{where}: the regex {pattern!r} {why}; rewrite it without a quantifier inside a "
                            "quantifier (e.g. `a+` for `(a+)+`), or make the inner part possessive (`(?:a++)+`)")
    return rx
