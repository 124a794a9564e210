"""The OpInfo sweep engine: compile each OpInfo sample with ``backend="simaccel"``, compare
with eager, and classify the op by what really ran.

An op's class, from its samples (the worst sample decides):

* ``device``: every compiled graph ran fully on the device: ``host_fallback_ops == 0``,
  no host fallback in the compile reports, and kernels launched
  (``runtime_stats()["kernel_launches"] > 0``) or the graph's ATen ops are all views
  (its outputs are views of device buffers: counted apart, as "views only");
* ``host``: some graph sent at least one ATen op to the host (the reports say which and
  why);
* ``error``: simaccel raised while eager (and Dynamo with ``aot_eager``) succeeded;
* ``mismatch``: a result differs from eager beyond the tolerance (:func:`tolerance`).

Samples that say nothing of simaccel are left out of the counts: eager itself raises,
Dynamo captures no graph (``not_captured``), Dynamo or AOTAutograd fail with
``aot_eager`` too (``dynamo``), or the graphs hold no ATen op (``no_compute``: e.g. an op
returning a shape or its input).

Random ops (dropout, bernoulli, ``empty``...) are classified but their values are not
compared (only dtypes and shapes): eager and the device draw different numbers.
"""
from __future__ import annotations

import contextlib
import io
import logging
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch._dynamo
from torch.utils._pytree import tree_flatten, tree_unflatten

import simaccel

#: classes that count (the denominator of "% on the device").
COUNTED = ("device", "host", "error", "mismatch")
_RANK = {"device": 0, "no_compute": -1, "host": 1, "mismatch": 2, "error": 3}

#: assert_close defaults (rtol, atol) by dtype, as torch.testing uses them.
_DEFAULT_TOL = {torch.float32: (1.3e-6, 1e-5), torch.float64: (1e-7, 1e-7),
                torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}
#: the floor simaccel's fused float32 kernels are held to (the op suite's reduction
#: tolerance): kernels fuse chains, accumulate sums in float64 and evaluate special
#: functions with their own polynomials, so they can differ from eager by a few ulps.
_FLOOR_TOL = {torch.float32: (1e-4, 1e-5), torch.float64: (1e-7, 1e-7),
              torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}


@dataclass
class SampleResult:
    status: str
    fallbacks: list[tuple[str, str]] = field(default_factory=list)
    launches: int = 0
    detail: str = ""


@dataclass
class OpResult:
    """The class of one OpInfo op (``name``: ``op.name`` plus ``.variant``)."""

    name: str
    status: str
    samples: int = 0
    fallbacks: list[tuple[str, str]] = field(default_factory=list)
    launches: int = 0
    detail: str = ""
    seconds: float = 0.0


def op_name(op: Any) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def tolerance(op: Any, dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol): the largest of the OpInfo's own ``toleranceOverride``s for ``dtype``
    (any test), assert_close's defaults, and simaccel's floor for fused kernels."""
    rtol, atol = _DEFAULT_TOL.get(dtype, (0.0, 0.0))
    floor = _FLOOR_TOL.get(dtype, (0.0, 0.0))
    rtol, atol = max(rtol, floor[0]), max(atol, floor[1])
    for info in getattr(op, "decorators", ()):
        for dec in getattr(info, "decorators", ()):
            tol = dec.d.get(dtype) if isinstance(getattr(dec, "d", None), dict) else None
            if isinstance(tol, float):  # precisionOverride: an atol
                atol = max(atol, tol)
            elif tol is not None:  # toleranceOverride
                rtol, atol = max(rtol, tol.rtol), max(atol, tol.atol)
    return rtol, atol


def _clone(obj: Any) -> Any:
    """Copies of the tensors in ``obj`` with their strides (leaves keep requires_grad)."""
    def copy(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        c = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype).copy_(t.detach()) \
            if 0 not in t.stride() or t.numel() == 0 else t.detach().clone()
        return c.requires_grad_(t.requires_grad)
    leaves, spec = tree_flatten(obj)
    return tree_unflatten([copy(x) for x in leaves], spec)


class _Call:
    """One sample as a function of its tensors (so they are graph inputs)."""

    def __init__(self, op: Any, sample: Any):
        self.fn = op.op
        leaves, self.spec = tree_flatten((sample.input, sample.args, sample.kwargs))
        self.leaves = leaves
        self.positions = [k for k, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

    def tensors(self) -> list[torch.Tensor]:
        return [self.leaves[k] for k in self.positions]

    def __call__(self, *tensors: torch.Tensor) -> Any:
        leaves = list(self.leaves)
        for k, t in zip(self.positions, tensors):
            leaves[k] = t
        inp, args, kwargs = tree_unflatten(leaves, self.spec)
        return self.fn(inp, *args, **kwargs)


def _run(fn: Any, tensors: list[torch.Tensor], backward: bool, seed: int = 0) -> Any:
    """(outputs, input grads or None); the grads come from random cotangents."""
    torch.manual_seed(seed)
    out = fn(*tensors)
    if not backward:
        return out, None
    leaves = [t for t in tree_flatten(out)[0]
              if isinstance(t, torch.Tensor) and t.requires_grad and t.grad_fn is not None]
    inputs = [t for t in tensors if t.requires_grad]
    if not leaves or not inputs:
        return out, None
    gen = torch.Generator().manual_seed(1)
    cotangents = [torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype)
                  for t in leaves]
    grads = torch.autograd.grad(leaves, inputs, cotangents, allow_unused=True)
    return out, grads


def _differences(actual: Any, expected: Any, rtol: float, atol: float,
                 values: bool = True, indices: bool = True) -> str:
    act, act_spec = tree_flatten(actual)
    exp, exp_spec = tree_flatten(expected)
    if act_spec != exp_spec:
        return f"output structure {act_spec} vs eager {exp_spec}"
    for k, (a, e) in enumerate(zip(act, exp)):
        if not isinstance(e, torch.Tensor):
            if values and a != e and not (e != e and a != a):
                return f"output {k}: {a!r} != {e!r}"
            continue
        if not isinstance(a, torch.Tensor) or a.shape != e.shape or a.dtype != e.dtype:
            return f"output {k}: {getattr(a, 'dtype', a)} {getattr(a, 'shape', '')} vs " \
                   f"eager {e.dtype} {tuple(e.shape)}"
        if not indices and e.dtype in (torch.int64, torch.int32):
            continue
        if values and e.layout == torch.strided:
            try:
                torch.testing.assert_close(a.detach(), e.detach(), rtol=rtol, atol=atol,
                                           equal_nan=True, check_stride=False)
            except AssertionError as exc:
                return f"output {k}: {str(exc).splitlines()[-1] if str(exc) else exc}"
    return ""


#: ops that return the positions of values: where values tie, eager's CPU sort (not
#: stable) and simaccel's (stable) may pick different, equally valid, positions.
TIE_OPS = {"sort", "argsort", "msort", "topk", "kthvalue", "median", "nanmedian", "mode",
           "masked.median", "max", "min", "cummax", "cummin", "nn.functional.max_pool1d",
           "nn.functional.max_pool2d", "nn.functional.max_pool3d",
           "nn.functional.adaptive_max_pool1d", "nn.functional.adaptive_max_pool2d",
           "nn.functional.adaptive_max_pool3d", "nn.functional.fractional_max_pool2d"}


def _has_ties(tensors: list[torch.Tensor]) -> bool:
    """True if some float/int input holds a value more than once."""
    for t in tensors:
        flat = t.detach().reshape(-1)
        if flat.numel() and flat.dtype != torch.bool and flat.unique().numel() < flat.numel():
            return True
    return False


def _random(call: _Call, tensors: list[torch.Tensor]) -> bool:
    """True if eager gives different values for different seeds (a random op)."""
    try:
        a, _ = _run(call, _clone(tensors), False, seed=0)
        b, _ = _run(call, _clone(tensors), False, seed=1)
        return bool(_differences(a, b, 0.0, 0.0))
    except Exception:
        return False


def _upcast(t: torch.Tensor) -> torch.Tensor:
    """A 16-bit float tensor as float32 (a leaf that requires grad as the original)."""
    if t.dtype not in (torch.float16, torch.bfloat16):
        return t.detach().clone()
    return t.detach().float().requires_grad_(t.requires_grad)


def _differs_from_float_reference(call: _Call, tensors: list[torch.Tensor], backward: bool,
                                  actual: Any, rtol: float, atol: float, random: bool) -> str:
    """inductor's ``reference_in_float`` check for the 16-bit floats: the op computed in
    float32 and rounded once to the result's dtype is the reference. Fused kernels round
    once, eager rounds after every op: where those differ the float32 reference decides.
    Returns the difference ("" when the compiled result matches the reference)."""
    try:
        reference = _run(call, [_upcast(t) for t in tensors], backward)
    except Exception:  # the op takes no float32 inputs here: no reference
        return "no float32 reference"
    flat_act, _ = tree_flatten(actual)
    flat_ref, spec = tree_flatten(reference)
    if len(flat_act) != len(flat_ref):
        return "float32 reference has another structure"
    rounded = [r.to(a.dtype) if isinstance(r, torch.Tensor) and isinstance(a, torch.Tensor)
               and r.is_floating_point() else r for a, r in zip(flat_act, flat_ref)]
    return _differences(actual, tree_unflatten(rounded, spec), rtol, atol, values=not random)


def _compile_and_run(call: _Call, tensors: list[torch.Tensor], backward: bool,
                     backend: str = "simaccel") -> Any:
    torch._dynamo.reset()
    compiled = torch.compile(call, backend=backend, dynamic=False)
    return _run(compiled, _clone(tensors), backward)


def run_sample(op: Any, sample: Any, dtype: torch.dtype, backward: bool) -> SampleResult:
    """Compile one sample, run it, compare with eager and classify it."""
    call = _Call(op, sample)
    tensors = call.tensors()
    try:
        expected = _run(call, _clone(tensors), backward)
    except Exception as exc:
        return SampleResult("eager_error", detail=repr(exc)[:200])
    device = simaccel.get_device()
    simaccel.clear_reports()
    device.reset_stats()
    try:
        actual = _compile_and_run(call, tensors, backward)
    except Exception as exc:
        return _classify_failure(call, tensors, backward, exc)
    reports = simaccel.reports()
    stats = device.runtime_stats()
    fallbacks = [fb for r in reports for fb in r.host_fallbacks]
    if not reports:
        return SampleResult("not_captured")
    rtol, atol = tolerance(op, dtype)
    random = op.has_nondeterministic_output or _random(call, tensors)
    diff = _differences(actual, expected, rtol, atol, values=not random)
    if diff and op.name in TIE_OPS and _has_ties(tensors) and \
            not _differences(actual, expected, rtol, atol, values=not random, indices=False):
        diff = ""  # the values agree; indices of equal values may differ (unstable sort)
    if diff and dtype in (torch.float16, torch.bfloat16):
        diff = _differs_from_float_reference(call, tensors, backward, actual, rtol, atol,
                                             random) and diff
    if diff:
        return SampleResult("mismatch", fallbacks, stats["kernel_launches"], diff)
    if fallbacks or stats["host_fallback_ops"]:
        return SampleResult("host", fallbacks, stats["kernel_launches"])
    # a graph of views only launches no kernel (its outputs are views of device buffers,
    # copied back): on the device; a graph without an ATen op computes nothing
    ops = sum(r.ops for r in reports)
    status = "device" if stats["kernel_launches"] or ops else "no_compute"
    return SampleResult(status, [], stats["kernel_launches"])


def _classify_failure(call: _Call, tensors: list[torch.Tensor], backward: bool,
                      exc: Exception) -> SampleResult:
    """An exception under simaccel: simaccel's fault only if ``aot_eager`` runs it."""
    detail = _error_text(exc)
    try:
        _compile_and_run(call, tensors, backward, backend="aot_eager")
    except Exception:
        return SampleResult("dynamo", detail=detail)
    return SampleResult("error", detail=detail)


def _error_text(exc: Exception) -> str:
    """One line: the exception's class and first lines, without Dynamo's advice."""
    text = str(exc).split("Set TORCHDYNAMO_VERBOSE")[0]
    return f"{type(exc).__name__}: " + " ".join(text.split())[:400]


def samples_of(op: Any, dtype: torch.dtype, backward: bool, limit: int) -> list[Any]:
    """Up to ``limit`` CPU samples of ``op`` in ``dtype`` (gradients when ``backward``)."""
    try:
        out = []
        for sample in op.sample_inputs("cpu", dtype, requires_grad=backward):
            out.append(sample)
            if len(out) >= limit:
                break
        return out
    except Exception:
        return []


def wants_backward(op: Any, dtype: torch.dtype) -> bool:
    return bool(op.supports_autograd) and dtype in op.supported_backward_dtypes("cpu")


def run_op(op: Any, dtype: torch.dtype = torch.float32, backward: bool = False,
           limit: int = 1) -> OpResult:
    """Classify ``op`` from up to ``limit`` samples (see the module docstring)."""
    start = time.perf_counter()
    backward = backward and wants_backward(op, dtype)
    result = OpResult(op_name(op), "unsupported_dtype")
    if dtype not in op.supported_dtypes("cpu"):
        return result
    result.status = "no_samples"
    # graph breaks and backend failures are logged by Dynamo; the sweep records them itself
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        for sample in samples_of(op, dtype, backward, limit):
            one = run_sample(op, sample, dtype, backward)
            _merge(result, one)
    result.seconds = time.perf_counter() - start
    return result


def _merge(result: OpResult, one: SampleResult) -> None:
    if one.status not in _RANK:  # says nothing of simaccel: keep the first such reason
        if result.status in ("no_samples", "unsupported_dtype"):
            result.status, result.detail = one.status, one.detail
        return
    result.samples += 1
    result.launches += one.launches
    result.fallbacks += [fb for fb in one.fallbacks if fb not in result.fallbacks]
    if result.status not in _RANK or _RANK[one.status] > _RANK[result.status]:
        result.status = one.status
        result.detail = one.detail or result.detail


def counted(results: list[OpResult]) -> list[OpResult]:
    return [r for r in results if r.status in COUNTED]


def summary_table(results: list[OpResult], title: str,
                  known: dict[str, str] | None = None) -> str:
    """The printed table: counts by class, % on the device, host ops with reasons."""
    rows = counted(results)
    counts = {k: sum(r.status == k for r in rows) for k in COUNTED}
    total = max(len(rows), 1)
    lines = [f"OpInfo sweep {title}: {len(rows)} captured, computing ops "
             f"(of {len(results)} swept)",
             "  " + ", ".join(f"{k} {v}" for k, v in counts.items())
             + f"  ({100.0 * counts['device'] / total:.1f}% on the device)"]
    skipped: dict[str, int] = {}
    for r in results:
        if r.status not in COUNTED:
            skipped[r.status] = skipped.get(r.status, 0) + 1
    if skipped:
        lines.append("  not counted: " + ", ".join(f"{k} {v}" for k, v in sorted(skipped.items())))
    for r in sorted(rows, key=lambda r: (r.status, r.name)):
        if r.status == "host":
            ops = "; ".join(f"{op}: {why}" for op, why in r.fallbacks[:3])
            lines.append(f"  host  {r.name:34s} {ops}")
        elif r.status in ("error", "mismatch"):
            lines.append(f"  {r.status:5s} {r.name:34s} {r.detail[:160]}")
    return "\n".join(lines)
