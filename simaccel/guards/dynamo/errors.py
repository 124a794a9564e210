"""simaccel's own errors reach the user as they are, not wrapped in ``BackendCompilerFailed``.

Dynamo (torch 2.13) wraps whatever a backend raises in ``BackendCompilerFailed``
(``OutputGraph._call_user_compiler`` in ``torch/_dynamo/output_graph.py``), except
``TensorifyScalarRestartAnalysis``, ``IndexError`` and ``ShortenTraceback``: those it
re-raises untouched. ``BackendCompilerFailed`` is itself a ``ShortenTraceback``, and every
later step treats the two alike: ``convert_frame`` lets a ``ShortenTraceback`` through (an
error for the user unless ``torch._dynamo.config.suppress_errors``, which runs the frame in
eager instead), and ``eval_frame`` trims its traceback to the frames below
``first_useful_frame``.

So :func:`errors_reach_user` re-raises a :class:`~simaccel.errors.SimAccelError` as an
instance of a class derived from both its own class and ``ShortenTraceback``: Dynamo
handles it exactly as the ``BackendCompilerFailed`` it would have made, and
``except simaccel.errors.UnsupportedOpError`` catches it. The message, attributes and
traceback are the original error's. One thing does not survive: ``eval_frame`` re-raises
with ``from None``, which clears ``__cause__`` (as it does for ``BackendCompilerFailed``);
so the copy keeps the original error as ``inner_exception``, as ``BackendCompilerFailed``
does, and ``err.inner_exception.__cause__`` is, say, the exception a user's guard check
raised.

"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

from torch._dynamo.exc import ShortenTraceback

from simaccel.errors import SimAccelError

CompilerFn = TypeVar("CompilerFn", bound=Callable[..., Any])

_PASSING_CLASSES: dict[type[SimAccelError], type[SimAccelError]] = {}


def passing_class(cls: type[SimAccelError]) -> type[SimAccelError]:
    """``cls`` made a ``ShortenTraceback`` too (one class per ``cls``, same name)."""
    found = _PASSING_CLASSES.get(cls)
    if found is None:
        found = type(cls.__name__, (cls, ShortenTraceback), {
            "__module__": cls.__module__, "__qualname__": cls.__qualname__,
            "__doc__": f"{cls.__doc__}\n\n(Raised through Dynamo unwrapped.)"})
        _PASSING_CLASSES[cls] = found
    return found


def passing_dynamo(err: SimAccelError, frame: FrameType | None) -> SimAccelError:
    """A copy of ``err`` that Dynamo passes on unwrapped; tracebacks shown to the user
    start at ``frame`` (``None``: Dynamo's frames stay in)."""
    cls = passing_class(type(err))
    copy = cls.__new__(cls)
    # Dynamo's attributes (frame_exec_strategy, ...), then the error's own (op, reason).
    ShortenTraceback.__init__(copy, *err.args, first_useful_frame=frame)
    copy.__dict__.update(err.__dict__)
    copy.inner_exception = err  # keeps the cause that Dynamo's ``from None`` clears
    return copy


def errors_reach_user(backend: CompilerFn) -> CompilerFn:
    """Wrap a Dynamo backend so that the :class:`SimAccelError` s it raises reach the user
    unwrapped (see the module docstring); anything else passes as it is."""
    @functools.wraps(backend)
    def compile_frame(*args: Any, **kwargs: Any) -> Any:
        try:
            return backend(*args, **kwargs)
        except SimAccelError as err:
            if isinstance(err, ShortenTraceback):
                raise  # a nested backend call already converted it
            tb = err.__traceback__.tb_next if err.__traceback__ is not None else None
            raise passing_dynamo(err, inspect.currentframe()).with_traceback(tb) from None
    return compile_frame  # type: ignore[return-value]
