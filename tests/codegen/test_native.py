"""Native kernel objects: a kernel numba compiled once loads in a later process without
numba, runs the same machine code, and anything unsound falls back to numba."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from simaccel.codegen import native
from tests.codegen.child import run_child_program
from simaccel.codegen.cache import KernelCache

F32 = "array(float32, 1d, C)"
SIG = (F32, F32, "int64")
SOURCE = textwrap.dedent("""\
    import numba
    import numpy as np


    @numba.njit(cache=True, error_model='numpy')
    def kernel(out, a, n):
        for i in range(n):
            out[i] = np.exp(a[i]) * np.float32(2.0) + np.float32(1.0)
    """)
#: numba's threading layer is part of numba, not of the process: never exported.
PARALLEL_SOURCE = SOURCE.replace("error_model='numpy'",
                                 "nogil=True, error_model='numpy', parallel=True") \
    .replace("range(n)", "numba.prange(n)")


def _expected(a: np.ndarray) -> np.ndarray:
    return np.exp(a) * np.float32(2.0) + np.float32(1.0)


def _run(fn, n: int = 7) -> tuple[np.ndarray, np.ndarray]:
    a = np.linspace(-2, 2, n, dtype=np.float32)
    out = np.zeros_like(a)
    fn(out, a, n)
    return out, a


def _native_files(root: Path) -> list[Path]:
    return sorted(root.glob("*.native"))


def test_compiled_kernel_is_exported_and_loads_natively(tmp_path):
    compiled = KernelCache(tmp_path).load(SOURCE, SIG)
    assert compiled.origin == "compiled" and len(_native_files(tmp_path)) == 1
    again = KernelCache(tmp_path).load(SOURCE, SIG)  # a new process's cache object
    assert again.origin == "disk" and isinstance(again.fn, native.NativeKernel)
    out, a = _run(again.fn)
    reference, _ = _run(compiled.fn)
    np.testing.assert_array_equal(out, reference)  # the same machine code
    np.testing.assert_allclose(out, _expected(a), rtol=1e-6)


def test_the_compiling_process_runs_the_exported_native_kernel(tmp_path):
    """The process that compiled a kernel runs the object it exported (as a later process
    would), not numba's dispatcher: launch groups of such kernels become command lists."""
    compiled = KernelCache(tmp_path).load(SOURCE, SIG)
    assert compiled.origin == "compiled" and isinstance(compiled.fn, native.NativeKernel)
    out, a = _run(compiled.fn)
    np.testing.assert_allclose(out, _expected(a), rtol=1e-6)


def test_a_kernel_exported_under_another_host_tag_is_exported_again(tmp_path):
    """numba's cache still has the kernel, but its native object carries another host
    tag (an older simaccel's): it is compiled once more and exported for this host,
    instead of importing numba in every later process."""
    KernelCache(tmp_path).load(SOURCE, SIG)
    (exported,) = _native_files(tmp_path)
    tag = exported.suffixes[-2]
    exported.rename(exported.with_name(exported.name.replace(tag, ".0123456789abcdef")))
    again = KernelCache(tmp_path).load(SOURCE, SIG)
    assert again.origin == "compiled" and isinstance(again.fn, native.NativeKernel)
    assert exported.exists()
    out, a = _run(again.fn)
    np.testing.assert_allclose(out, _expected(a), rtol=1e-6)
    third = KernelCache(tmp_path).load(SOURCE, SIG)  # the next process: no compile
    assert third.origin == "disk" and isinstance(third.fn, native.NativeKernel)


def test_native_kernel_rebinds_new_arrays_and_checks_them(tmp_path):
    KernelCache(tmp_path).load(SOURCE, SIG)
    fn = KernelCache(tmp_path).load(SOURCE, SIG).fn
    for n in (3, 9, 3):  # new arrays each call: pointers are never stale
        out, a = _run(fn, n)
        np.testing.assert_allclose(out, _expected(a), rtol=1e-6)
    with pytest.raises(TypeError, match="float32"):
        fn(np.zeros(4), np.zeros(4), 4)


#: TinyLM's log-softmax epilogue: its calls of the scalar ``logf``/``expf`` behind
#: ``lib.vlog``/``lib.vexp`` stay calls (they may raise), so numba keeps the incref/decref
#: of the array arguments, whose destructor the object must not need
HELPER_SOURCE = textwrap.dedent("""\
    import numba
    import numpy as np
    from simaccel.codegen import kernel_lib as lib


    @numba.njit(cache=True, error_model='numpy')
    def kernel(out, m, s, x):
        for i0 in range(4):
            for i1 in range(16):
                for i2 in range(16):
                    t0 = x[np.uint64(i0*256 + i1*16 + i2)]
                    t2 = np.float32(lib.vlog(s[np.uint64(i0*16 + i1)]))
                    t3 = m[np.uint64(i0*16 + i1)]
                    t6 = np.float32((np.float32(0.0) if np.abs(t3) == np.inf else t3))
                    out[np.uint64(i0*256 + i1*16 + i2)] = np.float32(lib.vexp(t0 - (t2 + t6)))
    """)
HELPER_SIG = (F32, F32, F32, F32)


def test_kernel_keeping_array_refcounts_is_exported(tmp_path):
    compiled = KernelCache(tmp_path).load(HELPER_SOURCE, HELPER_SIG)
    assert compiled.origin == "compiled" and len(_native_files(tmp_path)) == 1
    again = KernelCache(tmp_path).load(HELPER_SOURCE, HELPER_SIG)
    assert isinstance(again.fn, native.NativeKernel)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1024).astype(np.float32)
    m, s = rng.standard_normal(64).astype(np.float32), rng.random(64).astype(np.float32) + 1
    ours, reference = np.zeros_like(x), np.zeros_like(x)
    again.fn(ours, m, s, x)
    compiled.fn(reference, m, s, x)
    np.testing.assert_array_equal(ours, reference)
    expected = np.exp(x.reshape(64, 16) - (np.log(s) + m)[:, None]).reshape(-1)
    np.testing.assert_allclose(ours, expected, rtol=1e-5)


def test_parallel_kernel_stays_with_numba(tmp_path):
    """Never exported; a later process loads numba's cached code and runs its machine
    code in this process (:mod:`simaccel.codegen.numba_entry`)."""
    from simaccel.codegen.numba_entry import NumbaEntryKernel
    KernelCache(tmp_path).load(PARALLEL_SOURCE, SIG)
    assert _native_files(tmp_path) == []
    again = KernelCache(tmp_path).load(PARALLEL_SOURCE, SIG)
    assert again.origin == "disk" and isinstance(again.fn, NumbaEntryKernel)
    out, a = _run(again.fn)
    np.testing.assert_allclose(out, _expected(a), rtol=1e-6)


@pytest.mark.parametrize("damage", ["flip", "truncate", "header"])
def test_damaged_native_object_is_dropped_for_numba(tmp_path, damage, caplog):
    KernelCache(tmp_path).load(SOURCE, SIG)
    path, = _native_files(tmp_path)
    blob = bytearray(path.read_bytes())
    if damage == "flip":
        blob[-40] ^= 0xFF
    elif damage == "truncate":
        blob = blob[: len(blob) // 2]
    else:
        blob = blob.replace(b'"sha256"', b'"sha257"')
    path.write_bytes(bytes(blob))
    again = KernelCache(tmp_path).load(SOURCE, SIG)
    assert not isinstance(again.fn, native.NativeKernel)
    out, a = _run(again.fn)
    np.testing.assert_allclose(out, _expected(a), rtol=1e-6)
    assert "damaged" in caplog.text and not path.exists()


def test_object_needing_an_unknown_symbol_is_refused():
    assert native.load_object(b"not an object", SIG) is None
    header = {"entry": native.ENTRY, "signature": list(SIG), "undefined": ["numba_gil_ensure"],
              "sha256": "0" * 64}
    assert native.load_object(native.MAGIC + json.dumps(header).encode() + b"\n", SIG) is None


def test_only_flat_arrays_then_ints_are_exportable():
    assert native.exportable((F32, "int64"))
    assert not native.exportable(("int64", F32))
    assert not native.exportable(("array(float32, 2d, C)",))
    assert not native.exportable((F32, "float64"))


X86_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7B13
cpu MHz\t\t: 2450.000
flags\t\t: fpu sse sse2 avx avx2 fma

processor\t: 1
vendor_id\t: AuthenticAMD
cpu MHz\t\t: 2800.000
flags\t\t: fpu sse sse2 avx avx2 fma
"""


def test_the_host_tag_names_the_cpu_from_its_os_description(tmp_path):
    """The CPU's model and features come from /proc/cpuinfo (no LLVM to load in a cold
    process); a field that changes while running (the clock) is no part of it; another
    feature set is another tag."""
    path = tmp_path / "cpuinfo"
    path.write_text(X86_CPUINFO)
    described = native._described_cpu(str(path))
    assert described == ("vendor_id=AuthenticAMD", "cpu family=25", "model=1",
                         "model name=AMD EPYC 7B13", "flags=fpu sse sse2 avx avx2 fma")
    path.write_text(X86_CPUINFO.replace("2450.000", "1200.000"))
    assert native._described_cpu(str(path)) == described
    path.write_text(X86_CPUINFO.replace("avx2 fma\n\n", "avx2 fma avx512f\n\n"))
    assert native._described_cpu(str(path)) != described


def test_without_an_os_description_of_the_cpu_llvm_describes_it(tmp_path, monkeypatch):
    import llvmlite.binding as llvm

    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nmodel name\t: unknown\n")
    assert native._described_cpu(str(path)) is None
    assert native._described_cpu(str(tmp_path / "missing")) is None
    monkeypatch.setattr(native, "_described_cpu", lambda: None)
    native._host_facts.cache_clear()
    try:
        assert native._host_facts()[1:3] == (llvm.get_process_triple(),
                                             llvm.get_host_cpu_name())
    finally:
        native._host_facts.cache_clear()


PROGRAM = textwrap.dedent("""\
    import json, sys, torch, simaccel
    x = torch.arange(12.0).reshape(3, 4)
    f = torch.compile(lambda x: (x.exp() * 2 + 1).relu().sum(0), backend="simaccel")
    out = f(x)
    assert torch.allclose(out, (x.exp() * 2 + 1).relu().sum(0))
    stats = simaccel.get_device().runtime_stats()
    print(json.dumps({"numba": "numba" in sys.modules, **stats}))
    """)


def _run_program(cache_dir: Path, **env: str) -> dict:
    return run_child_program(PROGRAM, cache_dir, **env)


def test_warm_process_runs_without_importing_numba(tmp_path):
    first = _run_program(tmp_path)
    assert first["numba"] and first["kernels_compiled"] > 0
    second = _run_program(tmp_path)
    assert second["kernel_cache_hits"] == first["kernels_compiled"]
    assert second["kernel_launches"] > 0 and not second["numba"]


def _two_part_group(first, second) -> tuple:
    """A group launching ``first(mid, a, 9)`` then ``second(out, mid, 9)``, bound: (the
    launch, a, out)."""
    from simaccel.runtime import group as launch_group
    a = np.linspace(-2, 2, 9, dtype=np.float32)
    mid, out = np.zeros_like(a), np.zeros_like(a)
    group = launch_group.LaunchGroup([launch_group.GroupPart(first, 2, 1, 0),
                                      launch_group.GroupPart(second, 2, 1, 0)])
    return group.bind(mid, a, out, mid, 9, 9), a, out


def _chained(first, second, a: np.ndarray) -> np.ndarray:
    """``second(first(a))`` by plain calls (the reference)."""
    mid, out = np.zeros_like(a), np.zeros_like(a)
    first(mid, a, 9)
    second(out, mid, 9)
    return out


def test_a_launch_group_of_native_kernels_becomes_one_command_list(tmp_path):
    """After :data:`RECORD_AFTER` launches a group of native kernels runs as one native
    call with the same results, its parts in order (the second reads the first's)."""
    from simaccel.runtime import group as launch_group
    KernelCache(tmp_path).load(SOURCE, SIG)
    fn = KernelCache(tmp_path).load(SOURCE, SIG).fn
    assert isinstance(fn, native.NativeKernel)
    launch, a, out = _two_part_group(fn, fn)
    for _ in range(launch_group.RECORD_AFTER + 2):
        out[:] = 0
        launch()
    assert launch.recorded is not None  # the last launches ran the command list
    np.testing.assert_array_equal(out, _chained(fn, fn, a))  # the same code, in order


@pytest.mark.parametrize("record", [False, True])
def test_a_bound_group_patched_to_new_arrays_computes_into_them(tmp_path, record):
    """A host-mapped argument at a new address (a gradient, a new tensor every step) is
    patched into a bound group, before and after it became a command list: the launch
    reads and writes the new arrays, the old ones are left alone."""
    from simaccel.runtime import group as launch_group
    fn = KernelCache(tmp_path).load(SOURCE, SIG).fn
    first = KernelCache(tmp_path).load(SOURCE.replace("2.0", "3.0"), SIG).fn
    assert isinstance(fn, native.NativeKernel)
    launch, a, out = _two_part_group(first, fn)
    for _ in range(launch_group.RECORD_AFTER + 1 if record else 1):
        launch()
    assert (launch.recorded is not None) is record
    check_patched_group(launch, first, fn, out)


def check_patched_group(launch, first, second, out: np.ndarray) -> None:
    """Patch a bound :func:`_two_part_group`'s first input and second output to new
    arrays and launch it: the new output is ``second(first(new input))``, the old output
    is left alone."""
    new_a, new_out = np.linspace(0, 1, 9, dtype=np.float32), np.zeros_like(out)
    before = out.copy()
    launch.patch(1, new_a, new_a.ctypes.data)  # the first part's input
    launch.patch(2, new_out, new_out.ctypes.data)  # the second part's output
    launch()
    np.testing.assert_array_equal(new_out, _chained(first, second, new_a))
    np.testing.assert_array_equal(out, before)


NUMBA_ONLY_PROGRAM = textwrap.dedent("""\
    import json, pathlib, sys, torch, simaccel
    x = torch.randn(256, 512)  # enough exp work for numba's thread pool (prange)
    f = torch.compile(lambda x: (x.exp() * 2 + 1).log(), backend="simaccel",
                      options={"tier0": True})
    out = f(x)
    numba_after_first_call = "numba" in sys.modules
    kernel, = [k for k in simaccel.reports()[-1].kernels if k.kind != "library"]
    first_path = kernel.path
    simaccel.wait_for_kernels()
    again = f(x)
    for y in (out, again):
        torch.testing.assert_close(y, (x.exp() * 2 + 1).log(), rtol=1e-5, atol=1e-5)
    stats = simaccel.get_device().runtime_stats()
    print(json.dumps({"numba_after_first_call": numba_after_first_call,
                      "origin": kernel.origin, "first_path": first_path,
                      "parallel": "parallel=True" in pathlib.Path(kernel.path).read_text(),
                      **stats}))
    """)


def test_a_warm_process_loads_a_numba_only_kernel_after_its_first_call(tmp_path):
    """A kernel that runs in numba's thread pool has no native object: loading it means
    importing numba (~0.5 s). A warm process runs it in tier 0 on the first call and
    loads it from the cache when that call returns, counted as a cache hit."""
    env = {"SIMACCEL_COMPILE_WORKERS": "2"}
    cold = run_child_program(NUMBA_ONLY_PROGRAM, tmp_path, **env)
    assert cold["parallel"] and cold["kernels_compiled"] == 1
    warm = run_child_program(NUMBA_ONLY_PROGRAM, tmp_path, **env)
    assert not warm["numba_after_first_call"]
    assert warm["origin"] == "tier0" and warm["first_path"] == "(loaded after the first call)"
    assert warm["kernels_compiled"] == 0 and warm["kernel_cache_hits"] == 1
    assert warm["tier0_launches"] >= 1 and warm["kernel_launches"] >= 2


def test_a_group_with_a_dispatcher_part_is_patched_too(tmp_path):
    """A group with a part that is no native object (a prange kernel stays with numba's
    dispatcher) launches part by part: a patch moves a native part's pointer in place
    and gives the other part its new array."""
    fn = KernelCache(tmp_path).load(SOURCE, SIG).fn

    def double(out, a, n):  # stands for a dispatcher: no native_bind
        out[:n] = a[:n] * 2
    launch, a, out = _two_part_group(fn, double)
    launch()
    np.testing.assert_array_equal(out, _chained(fn, double, a))
    new_a, new_out = np.linspace(0, 1, 9, dtype=np.float32), np.zeros_like(a)
    launch.patch(1, new_a, new_a.ctypes.data)
    launch.patch(2, new_out, new_out.ctypes.data)
    launch()
    np.testing.assert_array_equal(new_out, _chained(fn, double, new_a))
