"""The part of Cython's `cython` module that the policies' pure-Python-mode sources use,
for when Cython is not installed: its decorators leave what they decorate as it is, its
types are Python's, `declare` returns the value given, `compiled` is False.

A source written in Cython's pure Python mode (`kvtier/policies/_arc_core.py`,
`_lct_core.py`) imports `cython` (Cython's own shadow module, the same no-ops, when Cython is
installed) and falls back to this module, so kvtier runs without Cython, as plain Python,
the text that `scripts/build-core` compiles. mypy reads such a source with this module as its
`cython`: a name of Cython's that the source uses and this module lacks fails the type check,
not a run without Cython.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar, cast

_T = TypeVar("_T")

compiled = False

# Cython's names of C types: Python's types here. `cython.int[::1]` (a typed memoryview)
# is `int` too at run time (`longlong` and `double` likewise); mypy cannot read it (see
# `_arc_core`).
if TYPE_CHECKING:
    int = builtins.int
    longlong = builtins.int
    double = builtins.float
else:

    class int(builtins.int):
        def __class_getitem__(cls, _item: object) -> type:
            return cls

    class longlong(builtins.int):
        def __class_getitem__(cls, _item: object) -> type:
            return cls

    class double(builtins.float):
        def __class_getitem__(cls, _item: object) -> type:
            return cls


void: TypeAlias = None
Py_ssize_t = builtins.int
bint = builtins.bool


def _same(thing: _T) -> _T:
    return thing


cclass = cfunc = inline = final = _same


def exceptval(*_args: Any, **_kwargs: Any) -> Callable[[_T], _T]:
    """`@cython.exceptval(...)`: how a compiled function reports an error; nothing here."""
    return _same


def declare(_type: Callable[..., _T], value: object = None, **_kwargs: object) -> _T:
    """`cython.declare(type, value)`: a C variable when compiled; here `value`."""
    return cast(_T, value)
