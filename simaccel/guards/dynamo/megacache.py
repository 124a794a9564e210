"""simaccel's entries in torch's Mega-Cache: ``torch.compiler.save_cache_artifacts()``
returns simaccel's kernels (module source and native object) and lifting decisions next to
torch's own artifacts, and ``torch.compiler.load_cache_artifacts()`` writes them into the
cache directory of a new process, which then compiles no kernel it received.

``torch.compiler._cache`` (the artifact registry) is private to torch. An artifact's key is
``"<kind>/<file name>"``; each kind has a writer (:func:`add_writer`) that checks the name
and content before writing (the cache holds code that gets executed). ``import simaccel``
registers the type, so do it before ``load_cache_artifacts``; a kind's writer registers when
its module is imported, which a load does first (:data:`WRITER_MODULES`: by name, as the
kernel cache's package imports every lowering, which a plain ``import simaccel`` must not).

A kernel still compiling in the background (tier 0) is recorded when it is loaded, so
``save_cache_artifacts`` first runs the hooks of :func:`add_before_save` (the tiered
kernels' wait): the artifacts carry every kernel the process started, not only those done.
"""
from __future__ import annotations

import importlib
import logging
from typing import Callable

from torch.compiler._cache import CacheArtifact, CacheArtifactFactory, CacheArtifactManager


__all__ = ["ARTIFACT_TYPE", "add_before_save", "add_writer", "record"]

log = logging.getLogger("simaccel")

ARTIFACT_TYPE = "simaccel"
#: kind -> writer(file name, content)
_WRITERS: dict[str, Callable[[str, bytes], None]] = {}
#: run before torch serialises the artifacts (``save_cache_artifacts``)
_BEFORE_SAVE: list[Callable[[], object]] = []
#: kind -> the module that registers its writer
WRITER_MODULES = {"kernel": "simaccel.codegen.cache", "lift": "simaccel.guards.lift_memory"}


class SimaccelCacheArtifact(CacheArtifact):
    """One simaccel cache file, carried by the Mega-Cache."""

    def populate_cache(self) -> None:
        kind, _, name = self.key.partition("/")
        if kind not in _WRITERS and kind in WRITER_MODULES:
            importlib.import_module(WRITER_MODULES[kind])
        writer = _WRITERS.get(kind)
        if writer is None:  # from another simaccel version: what it holds compiles anew
            log.warning("simaccel: skipping cache artifact %r of unknown kind", self.key)
            return
        writer(name, self.content)

    @staticmethod
    def type() -> str:
        return ARTIFACT_TYPE


if ARTIFACT_TYPE not in CacheArtifactFactory._artifact_types:
    CacheArtifactFactory.register(SimaccelCacheArtifact)


def add_writer(kind: str, writer: Callable[[str, bytes], None]) -> None:
    """Where artifacts of ``kind`` go when a process loads them."""
    _WRITERS[kind] = writer


def record(kind: str, name: str, content: bytes) -> None:
    """Offer a cache file to the Mega-Cache (the next ``save_cache_artifacts`` carries it;
    the same file twice is recorded once)."""
    CacheArtifactManager.record_artifact(ARTIFACT_TYPE, f"{kind}/{name}", content)


def add_before_save(hook: Callable[[], object]) -> None:
    """Run ``hook`` before every ``torch.compiler.save_cache_artifacts()`` (it records
    what it finishes, e.g. kernels compiling in the background)."""
    if hook not in _BEFORE_SAVE:
        _BEFORE_SAVE.append(hook)


def _serialize_after_hooks(cls):  # the wrapped CacheArtifactManager.serialize
    for hook in list(_BEFORE_SAVE):
        hook()
    return _TORCH_SERIALIZE.__func__(cls)


# torch serialises through CacheArtifactManager.serialize (a classmethod, torch 2.13);
# wrapped once per process, so that the hooks run however save_cache_artifacts is reached
_TORCH_SERIALIZE = getattr(CacheArtifactManager, "_simaccel_torch_serialize",
                           CacheArtifactManager.serialize)
CacheArtifactManager._simaccel_torch_serialize = _TORCH_SERIALIZE  # type: ignore[attr-defined]
CacheArtifactManager.serialize = classmethod(_serialize_after_hooks)  # type: ignore[method-assign]
