"""simaccel's logger in torch's logging system (``TORCH_LOGS``, ``torch._logging.set_logs``).

:func:`register_torch_logs` (run once when simaccel is imported) registers the log
``simaccel`` (the logger ``simaccel`` and its children such as ``simaccel.codegen``) with
torch, so that ``TORCH_LOGS="+simaccel"`` (DEBUG), ``"simaccel"`` (INFO) or ``"-simaccel"``
(ERROR), and ``torch._logging.set_logs(modules={"simaccel": logging.DEBUG})``, set its level
and print its records on stderr in torch's format, next to Dynamo's (``[0/0]`` compile ids).

``TORCH_LOGS`` is read when torch is imported, before simaccel: torch then finds
``simaccel`` as an importable module (and imports it), and the registration made by that
import turns the setting into a registered log. ``set_logs`` resolves the registered name
directly instead of importing every simaccel subpackage to find it.

Until torch applies log settings (``TORCH_LOGS`` or a ``set_logs`` call), simaccel's logger
is an ordinary Python logger whose records propagate to the root logger's handlers. Once it
applies them, torch treats it as it treats its own loggers: torch's stderr handler, no
propagation to the root logger.
"""
from __future__ import annotations

#: the log name in ``TORCH_LOGS`` / ``set_logs`` and the logger it controls
SIMACCEL_LOG = "simaccel"


def register_torch_logs() -> None:
    """Register the ``simaccel`` log with torch's logging system (idempotent)."""
    from torch._logging._internal import register_log
    register_log(SIMACCEL_LOG, SIMACCEL_LOG)
