"""Call plans: one program call on the simulated timeline as one record.

A compiled program's call moves the same batches and runs the same kernels every time:
its uploads (the per-call inputs, h2d; the constant bank, when a lifted scalar changed),
its kernels one after another on the compute track, its download (d2h) after the last
kernel. A :class:`CallPlan` holds all of that, worked out once, so that
:meth:`~simaccel.dma.engine.DmaEngine.record_call` places a whole call with one step per
channel share and one for the compute track, traces it as one ring entry and counts it
by adding one to the plan's call count (the counters are folded in when they are read).
Timeline, stats and trace are those of the same batches placed one by one
(:meth:`~simaccel.dma.engine.DmaEngine.copy_planned`) and the same kernels scheduled one
by one (:meth:`~simaccel.dma.engine.DmaEngine.schedule_compute`); only the float sum of
``compute_ns`` over many calls may differ in its last bits.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from simaccel.dma.plan import BatchPlan, ChannelDeal, check_timing


@dataclass(frozen=True)
class CallLayout:
    """Where a call plan's batches land when its first batch deals from one channel.

    uploads: per upload batch, its channel shares ((channel, total ns), ...); download:
    the download's (empty if none); next_channel: the channel the engine's round-robin
    cursor points at after the call; entry: the call's call-independent trace parts
    (plain tuples, see :func:`simaccel.dma.trace.call_spans`); spans: trace spans per
    call."""

    uploads: tuple[tuple[tuple[int, float], ...], ...]
    download: tuple[tuple[int, float], ...]
    next_channel: int
    entry: tuple
    spans: int


@dataclass(frozen=True, eq=False)
class CallPlan:
    """The batches and kernels of one kind of program call (see the module doc); made by
    :meth:`~simaccel.dma.engine.DmaEngine.plan_call` for that engine's timing. Compared
    and hashed by identity: the engine counts calls per plan object.

    ``uploads``: batches placed from the call's start, in order; ``kernels`` and
    ``durations``: the kernels in launch order and their simulated times (ns);
    ``download``: the batch placed after the last kernel, or None."""

    uploads: tuple[BatchPlan, ...]
    kernels: tuple[str, ...]
    durations: tuple[float, ...]
    download: BatchPlan | None
    timing: tuple[int, float, float, int]
    compute_tid: int
    #: sum of ``durations`` (ns), for the counters
    kernel_ns: float = 0.0
    _layouts: dict[int, CallLayout] = field(default_factory=dict, repr=False)

    @property
    def batches(self) -> tuple[BatchPlan, ...]:
        """Every batch of the call: the uploads, then the download."""
        return self.uploads if self.download is None else (*self.uploads, self.download)

    def layout(self, first: int) -> CallLayout:
        """The call's layout when its first batch deals from channel ``first`` (each
        batch deals from where the one before it stopped); made once per channel."""
        found = self._layouts.get(first)
        if found is None:
            found = self._layouts[first] = self._make_layout(first)
        return found

    def _make_layout(self, first: int) -> CallLayout:
        channels = self.timing[0]
        deals, parts, at = [], [], first
        for plan in self.batches:
            if not plan.nbytes:  # an empty batch deals nothing and leaves the cursor
                deals.append(ChannelDeal((), (), (), at))
                parts.append((plan.kind, (), (), (), (), (), ()))
                continue
            deal = plan.deal(at)
            deals.append(deal)
            parts.append((plan.kind, plan.names, deal.tids, deal.offsets, plan.durations,
                          plan.args(at), tuple(tid for tid, _ in deal.active)))
            at = deal.last + 1 if deal.last + 1 < channels else 0
        entry = (tuple(parts), len(self.uploads), self.kernels, self.durations,
                 self.compute_tid)
        spans = sum(len(plan.nbytes) for plan in self.batches) + len(self.kernels)
        shares = [deal.active for deal in deals]
        if self.download is None:
            return CallLayout(tuple(shares), (), at, entry, spans)
        return CallLayout(tuple(shares[:-1]), shares[-1], at, entry, spans)


def make_call(uploads: tuple[BatchPlan, ...], kernels: tuple[str, ...],
              durations: tuple[float, ...], download: BatchPlan | None,
              timing: tuple[int, float, float, int]) -> CallPlan:
    """A :class:`CallPlan` for an engine of ``timing`` (channels, latency_ns,
    bandwidth_gbps, burst_bytes); its batches must be planned for the same timing."""
    if len(kernels) != len(durations):
        raise ValueError(f"a call plan needs one duration per kernel, got {len(kernels)} "
                         f"kernels and {len(durations)} durations")
    if any(not d >= 0 for d in durations):
        raise ValueError(f"kernel durations must be >= 0 ns, got {durations}")
    batches = uploads if download is None else (*uploads, download)
    for plan in batches:
        check_timing("DMA batch plan", plan.timing, timing)
    total = 0.0
    for duration in durations:  # summed in launch order, as the kernels are placed
        total += duration
    return CallPlan(tuple(uploads), tuple(kernels), tuple(float(d) for d in durations),
                    download, timing, timing[0], total)
