"""Device memory: the arena and a caching allocator over it.

The allocator is modelled on PyTorch's CUDA caching allocator: it reserves *segments* from
the arena (the ``cudaMalloc`` of this device), carves *blocks* out of them, keeps freed
blocks cached for reuse (best fit, splitting larger blocks, coalescing neighbours on free),
and only when a request cannot be met releases every wholly free segment
(:meth:`CachingAllocator.empty_cache`) and retries once before raising
:class:`~simaccel.errors.DeviceOutOfMemoryError`. Stats use ``torch.cuda.memory_stats``
key names so tooling written for CUDA reads them unchanged.

Zero-byte requests get a block of one minimum unit (``CachingAllocator.unit`` bytes) so
every block, even an empty one, has a distinct, aligned, valid offset and the same free
rules as any other block.
"""
from __future__ import annotations

import bisect
import math
import numbers
import threading
from typing import Any

import numpy as np

from simaccel.errors import DeviceOutOfMemoryError, SimAccelError

#: Every block size is a multiple of this (bytes), as in PyTorch (kMinBlockSize).
MIN_BLOCK_BYTES = 512
#: Requests up to this size share segments of SMALL_SEGMENT_BYTES (bytes; kSmallSize).
SMALL_REQUEST_BYTES = 1 << 20
#: Segment size for small requests (bytes; kSmallBuffer).
SMALL_SEGMENT_BYTES = 2 << 20
#: Larger requests get segments rounded up to a multiple of this (bytes; kRoundLarge).
LARGE_SEGMENT_ROUND = 2 << 20

_STAT_NAMES = ("allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes",
               "requested_bytes", "allocation", "segment")


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class Block:
    """A range of the arena handed out by :meth:`CachingAllocator.malloc`.

    offset: bytes from the arena start (a multiple of the allocator's alignment).
    size: bytes reserved for it (``requested`` rounded up to the allocator's unit).
    requested: bytes asked for.
    allocated: False once freed (a freed handle is never handed out again).
    """

    __slots__ = ("offset", "size", "requested", "allocated", "segment", "prev", "next",
                 "_owner")

    def __init__(self, offset: int, size: int, segment: "_Segment", owner: object):
        self.offset = offset
        self.size = size
        self.requested = 0
        self.allocated = False
        self.segment = segment
        self.prev: Block | None = None
        self.next: Block | None = None
        self._owner = owner

    @property
    def is_split(self) -> bool:
        """True when the block is not its segment's only block."""
        return self.prev is not None or self.next is not None

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else "free"
        return (f"Block(offset={self.offset}, size={self.size}, "
                f"requested={self.requested}, {state})")


class _Segment:
    __slots__ = ("offset", "size", "first")

    def __init__(self, offset: int, size: int):
        self.offset = offset
        self.size = size
        self.first: Block | None = None


class _Stat:
    """current/peak plus cumulative increases (allocated) and decreases (freed)."""

    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self) -> None:
        self.current = self.peak = self.allocated = self.freed = 0

    def update(self, delta: int) -> None:
        if delta > 0:
            self.allocated += delta
        else:
            self.freed -= delta
        self.current += delta
        self.peak = max(self.peak, self.current)


class _ArenaRanges:
    """Unreserved ranges of the arena as sorted, coalesced (offset, size) pairs (bytes)."""

    def __init__(self, capacity_bytes: int):
        self.ranges: list[tuple[int, int]] = [(0, capacity_bytes)] if capacity_bytes else []

    def take(self, size: int) -> int | None:
        """Best-fit ``size`` bytes; returns the offset or None when no range fits."""
        fits = [(rsize, off, i) for i, (off, rsize) in enumerate(self.ranges) if rsize >= size]
        if not fits:
            return None
        rsize, off, i = min(fits)
        if rsize == size:
            del self.ranges[i]
        else:
            self.ranges[i] = (off + size, rsize - size)
        return off

    def give_back(self, offset: int, size: int) -> None:
        """Return a range, merging it with adjacent free ranges."""
        i = bisect.bisect_left(self.ranges, (offset, 0))
        self.ranges.insert(i, (offset, size))
        if i + 1 < len(self.ranges) and offset + size == self.ranges[i + 1][0]:
            self.ranges[i] = (offset, size + self.ranges[i + 1][1])
            del self.ranges[i + 1]
        if i > 0 and self.ranges[i - 1][0] + self.ranges[i - 1][1] == offset:
            prev_off, prev_size = self.ranges[i - 1]
            self.ranges[i - 1] = (prev_off, prev_size + self.ranges[i][1])
            del self.ranges[i]

    def largest(self) -> int:
        return max((size for _, size in self.ranges), default=0)


class CachingAllocator:
    """A caching allocator over an arena of ``capacity_bytes`` (see the module doc).

    capacity_bytes: arena size (bytes, > 0).
    alignment: every block offset and size is a multiple of it (bytes, power of two).

    Thread safe: every public method takes the allocator's lock.
    """

    def __init__(self, capacity_bytes: int, alignment: int):
        if not _is_positive_int(capacity_bytes):
            raise SimAccelError(f"capacity_bytes must be a positive int, got {capacity_bytes!r}")
        if not _is_positive_int(alignment) or alignment & (alignment - 1):
            raise SimAccelError(f"alignment must be a power of two, got {alignment!r}")
        self.capacity_bytes = int(capacity_bytes)
        self.alignment = int(alignment)
        self.unit = math.lcm(MIN_BLOCK_BYTES, self.alignment)
        self._lock = threading.RLock()
        # A tail shorter than one unit can never hold a block, so it is not offered.
        self._arena = _ArenaRanges(self.capacity_bytes // self.unit * self.unit)
        self._segments: dict[int, _Segment] = {}
        self._free_keys: list[tuple[int, int]] = []  # (size, offset), sorted: best fit
        self._free_blocks: dict[int, Block] = {}  # offset -> cached free block
        self._stats = {name: _Stat() for name in _STAT_NAMES}
        self._counters = dict.fromkeys(
            ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free"), 0)

    def round_size(self, nbytes: int) -> int:
        """Bytes a request of ``nbytes`` occupies (a multiple of ``unit``, at least one unit)."""
        return _round_up(max(int(nbytes), 1), self.unit)

    # -- malloc ---------------------------------------------------------------------------
    def malloc(self, nbytes: int) -> Block:
        """A block of at least ``nbytes`` bytes; raises DeviceOutOfMemoryError when even
        releasing cached segments cannot make room (the allocator stays usable)."""
        block = self.try_malloc(nbytes)
        if block is None:
            with self._lock:
                self._counters["num_ooms"] += 1
                raise DeviceOutOfMemoryError(
                    int(nbytes), self.capacity_bytes - self._stats["allocated_bytes"].current,
                    self._largest_free_block(), self.capacity_bytes)
        return block

    def try_malloc(self, nbytes: int) -> Block | None:
        """:meth:`malloc` that returns None instead of raising (and counts no OOM): for a
        caller that can free memory of its own and ask again."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral) or nbytes < 0:
            raise SimAccelError(f"malloc() needs a byte count >= 0, got {nbytes!r}")
        nbytes = int(nbytes)
        size = self.round_size(nbytes)
        with self._lock:
            block = self._take_cached(size) or self._reserve_segment(size)
            if block is None:
                # Like PyTorch: give every wholly free cached segment back, then retry once.
                self.empty_cache()
                self._counters["num_alloc_retries"] += 1
                block = self._reserve_segment(size)
            return None if block is None else self._activate(block, size, nbytes)

    def _take_cached(self, size: int) -> Block | None:
        i = bisect.bisect_left(self._free_keys, (size, -1))
        if i == len(self._free_keys):
            return None
        _, offset = self._free_keys[i]
        block = self._free_blocks[offset]
        self._uncache(block)
        return block

    def _reserve_segment(self, size: int) -> Block | None:
        preferred = SMALL_SEGMENT_BYTES if size <= SMALL_REQUEST_BYTES else size
        preferred = _round_up(_round_up(preferred, LARGE_SEGMENT_ROUND), self.unit)
        for seg_size in dict.fromkeys((preferred, size)):  # exact size if preferred won't fit
            offset = self._arena.take(seg_size)
            if offset is None:
                continue
            segment = _Segment(offset, seg_size)
            segment.first = Block(offset, seg_size, segment, self)
            self._segments[offset] = segment
            self._stats["reserved_bytes"].update(seg_size)
            self._stats["segment"].update(1)
            self._counters["num_device_alloc"] += 1
            return segment.first
        return None

    def _activate(self, free: Block, size: int, nbytes: int) -> Block:
        # A fresh handle per malloc: a stale (freed) handle can never free someone else's block.
        block = Block(free.offset, size, free.segment, self)
        block.requested, block.allocated = nbytes, True
        self._relink(free, block, block)
        if free.size > size:
            rest = Block(free.offset + size, free.size - size, free.segment, self)
            rest.prev, rest.next, block.next = block, block.next, rest
            if rest.next is not None:
                rest.next.prev = rest
            self._cache(rest)
        for name in ("allocated_bytes", "active_bytes"):
            self._stats[name].update(size)
        self._stats["requested_bytes"].update(nbytes)
        self._stats["allocation"].update(1)
        return block

    # -- free -----------------------------------------------------------------------------
    def free(self, block: Block) -> None:
        """Return ``block`` to the cache, merging it with free neighbours in its segment.

        Raises SimAccelError on a double free or a block of another allocator."""
        with self._lock:
            if not isinstance(block, Block) or block._owner is not self:
                raise SimAccelError(f"free() of a block not allocated by this allocator: "
                                    f"{block!r}")
            if not block.allocated:
                raise SimAccelError(f"double free of {block!r}")
            block.allocated = False
            for name in ("allocated_bytes", "active_bytes"):
                self._stats[name].update(-block.size)
            self._stats["requested_bytes"].update(-block.requested)
            self._stats["allocation"].update(-1)
            merged = Block(block.offset, block.size, block.segment, self)
            self._relink(block, merged, merged)
            for neighbour in (merged.prev, merged.next):
                if neighbour is not None and not neighbour.allocated:
                    self._uncache(neighbour)
                    merged = self._merge(neighbour, merged)
            self._cache(merged)

    def _merge(self, neighbour: Block, block: Block) -> Block:
        lo, hi = (neighbour, block) if neighbour.offset < block.offset else (block, neighbour)
        joined = Block(lo.offset, lo.size + hi.size, lo.segment, self)
        joined.prev, joined.next = lo.prev, hi.next
        self._relink(lo, joined, None)
        if hi.next is not None:
            hi.next.prev = joined
        return joined

    def _relink(self, old: Block, new: Block, keep_links_of: Block | None) -> None:
        """Put ``new`` in ``old``'s place in the segment's list (copying old's links when
        ``keep_links_of`` is given)."""
        if keep_links_of is not None:
            new.prev, new.next = old.prev, old.next
            if old.next is not None:
                old.next.prev = new
        if new.prev is not None:
            new.prev.next = new
        else:
            new.segment.first = new

    def _cache(self, block: Block) -> None:
        bisect.insort(self._free_keys, (block.size, block.offset))
        self._free_blocks[block.offset] = block
        if block.is_split:
            self._stats["inactive_split_bytes"].update(block.size)

    def _uncache(self, block: Block) -> None:
        i = bisect.bisect_left(self._free_keys, (block.size, block.offset))
        del self._free_keys[i]
        del self._free_blocks[block.offset]
        if block.is_split:
            self._stats["inactive_split_bytes"].update(-block.size)

    # -- cache control and inspection -------------------------------------------------------
    def empty_cache(self) -> int:
        """Release every wholly free segment back to the arena; returns bytes released."""
        with self._lock:
            released = 0
            for offset, segment in list(self._segments.items()):
                block = segment.first
                if block is None or block.allocated or block.next is not None:
                    continue
                self._uncache(block)
                del self._segments[offset]
                self._arena.give_back(offset, segment.size)
                self._stats["reserved_bytes"].update(-segment.size)
                self._stats["segment"].update(-1)
                self._counters["num_device_free"] += 1
                released += segment.size
            return released

    def _largest_free_block(self) -> int:
        cached = self._free_keys[-1][0] if self._free_keys else 0
        return max(cached, self._arena.largest())

    def memory_stats(self) -> dict[str, int]:
        """Flat stats with ``torch.cuda.memory_stats`` names (``allocated_bytes.all.current``,
        ``reserved_bytes.all.peak``, ``num_ooms``, ...; bytes or counts), plus
        ``largest_free_block_bytes`` (largest request that would succeed now, bytes) and
        ``capacity_bytes``."""
        with self._lock:
            out: dict[str, int] = {}
            for name, stat in self._stats.items():
                for field in ("current", "peak", "allocated", "freed"):
                    out[f"{name}.all.{field}"] = getattr(stat, field)
            out.update(self._counters)
            out["largest_free_block_bytes"] = self._largest_free_block()
            out["capacity_bytes"] = self.capacity_bytes
            return out

    def reset_peak_stats(self) -> None:
        """Set every peak to its current value."""
        with self._lock:
            for stat in self._stats.values():
                stat.peak = stat.current

    def reset_accumulated_stats(self) -> None:
        """Zero the cumulative allocated/freed totals and the event counters."""
        with self._lock:
            for stat in self._stats.values():
                stat.allocated = stat.freed = 0
            for name in self._counters:
                self._counters[name] = 0

    def snapshot(self) -> list[dict[str, Any]]:
        """Segments (offset, size, blocks with offset/size/requested/allocated), by offset;
        like ``torch.cuda.memory_snapshot``."""
        with self._lock:
            out = []
            for offset in sorted(self._segments):
                segment, blocks = self._segments[offset], []
                block = segment.first
                while block is not None:
                    blocks.append({"offset": block.offset, "size": block.size,
                                   "requested": block.requested, "allocated": block.allocated})
                    block = block.next
                out.append({"offset": segment.offset, "size": segment.size, "blocks": blocks})
            return out

    def memory_summary(self) -> str:
        """A text table in the style of ``torch.cuda.memory_summary()``."""
        return format_memory_summary(self.memory_stats())


def _is_positive_int(value: object) -> bool:
    return (not isinstance(value, bool) and isinstance(value, numbers.Integral)
            and int(value) > 0)


def format_bytes(nbytes: int) -> str:
    """``nbytes`` as B/KiB/MiB/GiB text."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_memory_summary(stats: dict[str, int]) -> str:
    """Render a :meth:`CachingAllocator.memory_stats` dict as a summary table."""
    rule, thick = "|" + "-" * 75 + "|", "|" + "=" * 75 + "|"
    lines = [thick, "|" + "simaccel device memory summary".center(75) + "|", rule,
             "|" + f"  OOMs: {stats['num_ooms']:<10}  alloc retries: "
             f"{stats['num_alloc_retries']:<10}  capacity: "
             f"{format_bytes(stats['capacity_bytes'])}".ljust(75) + "|", thick,
             "| Metric                | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |",
             rule]
    rows = [("Allocated memory", "allocated_bytes", True),
            ("Active memory", "active_bytes", True),
            ("Requested memory", "requested_bytes", True),
            ("Reserved memory", "reserved_bytes", True),
            ("Non-releasable memory", "inactive_split_bytes", True),
            ("Allocations", "allocation", False),
            ("Reserved segments", "segment", False)]
    for label, key, is_bytes in rows:
        cells = [stats[f"{key}.all.{f}"] for f in ("current", "peak", "allocated", "freed")]
        text = [format_bytes(c) if is_bytes else str(c) for c in cells]
        lines.append(f"| {label:<21} | " + " | ".join(f"{t:>10}" for t in text) + " |")
    lines += [rule, f"| Largest free block: {format_bytes(stats['largest_free_block_bytes'])}"
              .ljust(76) + "|", thick]
    return "\n".join(lines)


#: host alignment of the arena's first byte (bytes): a page, so that a block the allocator
#: aligns to ``DeviceConfig.alignment`` within the arena is aligned that way in host memory
#: too, as a device buffer is on hardware (numpy starts a large array 16 bytes into a page,
#: which put every device buffer 16 bytes off a 64-byte line)
ARENA_ALIGNMENT = 4096


def _page_aligned(nbytes: int) -> np.ndarray:
    """``nbytes`` uninitialised bytes starting at a multiple of :data:`ARENA_ALIGNMENT`."""
    raw = np.empty(nbytes + ARENA_ALIGNMENT, dtype=np.uint8)
    skip = -raw.__array_interface__["data"][0] % ARENA_ALIGNMENT
    return raw[skip:skip + nbytes]  # the view keeps ``raw`` alive


class DeviceMemory:
    """The device arena: ``capacity_bytes`` of host memory standing in for device DRAM.

    The numpy buffer is created on first use with ``np.empty``, which reserves virtual
    memory without touching pages, so a 1 GiB arena costs only what is written.
    """

    def __init__(self, capacity_bytes: int):
        if not _is_positive_int(capacity_bytes):
            raise SimAccelError(f"capacity_bytes must be a positive int, got {capacity_bytes!r}")
        self.capacity_bytes = int(capacity_bytes)
        self._arena: np.ndarray | None = None
        self._lock = threading.Lock()

    @property
    def arena(self) -> np.ndarray:
        """The whole arena as a 1-D uint8 array (created on first access)."""
        if self._arena is None:
            with self._lock:
                if self._arena is None:
                    self._arena = _page_aligned(self.capacity_bytes)
        return self._arena

    @property
    def address(self) -> int:
        """The arena's host address (bytes): a view at offset ``o`` starts at
        ``address + o``."""
        return int(self.arena.__array_interface__["data"][0])

    @property
    def materialized(self) -> bool:
        """True once the arena's numpy buffer exists."""
        return self._arena is not None

    def view(self, offset_bytes: int, dtype: np.dtype | type | str, numel: int) -> np.ndarray:
        """A writable 1-D ``dtype`` view of ``numel`` elements starting ``offset_bytes`` into
        the arena; the offset must be a multiple of the dtype's itemsize (bytes)."""
        dt = np.dtype(dtype)
        offset_bytes, numel = int(offset_bytes), int(numel)
        nbytes = numel * dt.itemsize
        if offset_bytes % dt.itemsize:
            raise SimAccelError(f"offset {offset_bytes} is not aligned to {dt} "
                                f"(itemsize {dt.itemsize} bytes)")
        if numel < 0 or offset_bytes < 0 or offset_bytes + nbytes > self.capacity_bytes:
            raise SimAccelError(f"view of {nbytes} bytes at offset {offset_bytes} is outside "
                                f"the {self.capacity_bytes}-byte arena")
        return self.arena[offset_bytes:offset_bytes + nbytes].view(dt)
