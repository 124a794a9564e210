"""Fused scaled dot-product attention: one kernel template, the flash-attention tiling on
the device's BLAS (:mod:`.blas_lib`).

Each task of the parallel loop is one block of :data:`query_block` query rows of one
(batch, head): the block's scores against the keys it may see (causal: keys up to its
last row, so masked blocks cost nothing) by one GEMM into a scratch tile, each row's
softmax in that tile (its max, its exps and their sum; its logsumexp stored for the
backward), the unnormalised weights times the values by a second GEMM straight into
the output rows, each row then scaled by 1 / its sum. The tile stays in cache; no score
matrix is written, and every operand element is read from device memory once per
(batch, head) (the block's rows of q, the keys and values it sees, hot in cache for the
next block of the same head). This is eager's own CPU flash kernel's recurrence with a
whole key row per block (the rows are short enough to fit), so it matches eager's
rounding closely: scores as ``alpha * q @ k^T`` in the GEMM, exps of ``score - max``,
the output times the sum's reciprocal.

Operands are (batch, head, rows, dim) with any batch, head and row strides and a unit
dim stride; ``out`` as eager lays it out, ``lse`` contiguous (batch, head, query). An
additive mask (what a boolean one becomes before the op: 0 where kept, -inf where not)
is a sixth buffer read in place with any strides, 0 along the dims it is broadcast on;
it is added to each row's scores in the tile. A row it masks whole attends to nothing:
output 0 and logsumexp 0, as eager's op returns (not 0 / 0). A padding mask (any mask
padding a block's last or first keys, with -inf or a dtype's minimum, in all its rows:
right or left padding) has them left out of the block (:data:`_MASK_ROW`), as
variable-length flash attention skips padding: a padded batch costs its kept keys. Those
keys' weights are exact zeros, so the result is the same, except that NaN or inf in a
padded key or its value never reaches the output (eager's op, and the tier-0 form, weigh
them by 0).
"""
from __future__ import annotations

from typing import Any, Sequence

from simaccel.codegen.blas_symbols import has_gemm
from simaccel.codegen.dtypes import compute_dtype
from simaccel.codegen.sizes import hint, is_symbolic, is_value, same_size

#: parameters of the template after its five buffers (``out, lse, q, k, v``)
#: (``G``: query heads per key and value head, 1 but under grouped-query attention)
PARAMS = ("B, H, L, S, D, DV, BQ, G, q_off, q_sb, q_sh, q_sl, k_off, k_sb, k_sh, k_sl, "
          "v_off, v_sb, v_sh, v_sl, o_sb, o_sh, o_sl")
#: the mask's offset and (batch, head, query, key) strides, after :data:`PARAMS`
MASK_PARAMS = "m_off, m_sb, m_sh, m_sl, m_ss"


#: the fewest tasks a non-causal kernel's blocks are cut into (two per core, or more)
MIN_TASKS = 4


def query_block(length: Any, causal: bool = True, batch_heads: Any = MIN_TASKS) -> int:
    """Query rows per task (for dynamic sizes, by the sizes seen while tracing: a
    heuristic, never a guard). Measured on the 2-core machine, fused kernel over eager's
    op, head dim 64, each alone in alternating rounds. Causal, where smaller blocks skip
    more masked keys: 128 queries 0.73 with 32 rows, 0.77 with 64; 512
    queries 0.66-0.71 with 32, 0.63-0.66 with 64; 1024: 0.89-0.90 with 32, 0.84 with 64.
    Not causal, where a larger block halves the GEMM calls: 4x8x128: 0.98 with 32, 0.90
    with 64, 0.87 with 128; 512 queries 1.09, 1.03, 0.98; 1024: 1.17, 1.09, 1.06; so 128
    rows, fewer where that leaves under :data:`MIN_TASKS` tasks (``batch_heads``: batch
    times heads)."""
    if causal:
        return 32 if hint(length) <= 256 else 64
    block = 128
    while block > 32 and hint(batch_heads) * -(-hint(length) // block) < MIN_TASKS:
        block //= 2
    return block


def fused_attention_takes(shapes: Sequence[Sequence[Any]], dtypes: Sequence[str],
                          dropout_p: Any) -> bool:
    """True if the template computes attention on query, key, value and (if a fourth is
    given) an additive mask of these shapes (static or dynamic sizes; a dynamic size is
    at least 2) and dtypes (numpy names): 4-D operands whose batch, head and head-dim
    sizes match, and key and value lengths; a mask broadcastable to (batch, head, query,
    key), of the operands' dtype or their compute dtype; no dropout; one float dtype
    whose compute dtype (float32 for the 16-bit floats, computed in float32 as eager's op
    accumulates them) the device's BLAS has a GEMM for. The op itself fails on operands
    whose sizes differ there, so a dynamic pair the shape env does not know equal (a KV
    cache's key and value lengths, two symbols) is guarded equal: a guard no valid call
    fails."""
    if dropout_p or len(shapes) not in (3, 4) or len(set(dtypes[:3])) != 1:
        return False
    compute = compute_dtype(dtypes[0])
    if dtypes[3:] and dtypes[3] not in (dtypes[0], compute):
        return False
    mask = shapes[3] if len(shapes) == 4 else ()
    if not all(len(s) == 4 for s in shapes[:3]) or len(mask) > 4:
        return False
    if not all(is_symbolic(d) or int(d) > 0 for s in shapes for d in s):
        return False
    (b, h, length, d), (kb, kh, s, kd), (vb, vh, vs, _) = shapes[:3]
    pairs = [(b, kb), (b, vb), (kh, vh), (d, kd), (s, vs)]
    for size, full in zip(reversed(mask), (s, length, h, b)):
        if not is_value(size, 1):  # broadcast along a dim of static size 1
            pairs.append((size, full))
    return has_gemm(compute) and all(same_size(x, y) or bool(x == y) for x, y in pairs) \
        and heads_group(h, kh) is not None


def heads_group(heads: Any, kv_heads: Any) -> int | None:
    """Query heads per key and value head: 1 where the counts are equal (a dynamic pair
    guarded equal, as the sizes above), ``heads // kv_heads`` for grouped-query attention
    (static counts, one a multiple of the other: SDPA's ``enable_gqa``, which passes the
    fewer key and value heads to the op), None otherwise."""
    if same_size(heads, kv_heads):
        return 1
    if is_symbolic(heads) or is_symbolic(kv_heads):
        return 1 if bool(heads == kv_heads) else None
    return heads // kv_heads if heads % kv_heads == 0 else None


def _scale_source(dtype: str, scale: float | None) -> str:
    """The softmax scale: ``scale``, or eager's default ``1 / sqrt(D)`` (in double, then
    rounded to the dtype) from the head dim ``D`` the kernel is called with."""
    value = "1.0 / np.sqrt(np.float64(D))" if scale is None else repr(scale)
    return f"np.{dtype}({value})"


#: a mask's key index in the source, by its key stride known at compile time (1: stored
#: rows, 0: broadcast along the keys, None: a stride given at run time). A known stride
#: lets LLVM vectorise the add: the strided form took 2.34 ms where the add-free kernel
#: took 2.06 (4x8x128x64, a padding mask).
_MASK_KEY = {1: "mrow + j", 0: "mrow", None: "mrow + j*m_ss"}


#: one key column of the block's mask rows (``{index}``), leaving the enclosing loop
#: unless the mask pads it (:data:`MASKED_AT_MOST`) in every row checked
_PADDED_COLUMN = """            col = m0 + ({index})*m_ss
            i = 0
            while i < checked:
                value = mask[np.uint64(col + i*m_sl)]
                if value > {masked}:
                    break
                padded_finite = padded_finite or value != -np.inf
                i += 1
            if i < checked:
                break
"""

#: the block's first mask row; the keys the mask pads in every row of the block at its
#: end (right padding) and at its start (left padding, as batched generation pads its
#: prompts) are left out of the block: its GEMMs and softmax see the kept keys
#: ``first .. keys - 1`` only (at least one, so a row masked whole still gives output 0
#: and logsumexp 0). One row is checked for a key padding mask, whose query stride is 0.
#: ``padded_finite``: a trimmed key was padded with a finite value, so each row must
#: keep a key (see :data:`KEPT_ABOVE`) or the block is not trimmed. Measured on
#: 8x8x128x64 with sequence lengths drawn from 32-128 (57% of the keys kept), the call:
#: 1.62-1.71 ms against 1.98-2.14 ms without the trim (eager's op: 2.2-3.0 ms); every
#: sequence left-padded to 32 keys of 128 (Hugging Face's float32-minimum mask), the
#: kernel: 0.94-0.96 ms against 1.89-1.92 ms; the bench's workload (one of four
#: sequences padded by a quarter), the kernel: 932-956 against 956-967 us
_MASK_ROW = """        m0 = m_off + b*m_sb + h*m_sh + r0*m_sl
        checked = rows if m_sl != 0 else 1
        full = keys
        padded_finite = False
        while keys > 1:
{tail}            keys -= 1
        while first < keys - 1:
{head}            first += 1
        if padded_finite:
            for i in range(checked):
                limit = {seen}
                j = first  # the keys before it are padded in every row
                while j < limit and mask[np.uint64(m0 + i*m_sl + j*m_ss)] <= {kept}:
                    j += 1
                if j >= limit:
                    keys = full
                    first = 0
                    break
        m0 += first*m_ss
"""

#: a mask value at or below this is padding the trim may skip: -inf, or a dtype's most
#: negative value as Hugging Face's masks hold it (float32 and bfloat16 ~-3.4e38)
MASKED_AT_MOST = -1e38
#: a finite padding value weighs exactly 0 only beside a key of its row that is kept
#: (mask above this): its exp(score + mask - max) is then below exp(-0.99e38). A row
#: padded whole with finite values is uniform attention over every key it sees, so a
#: block where some row has no such key is not trimmed
KEPT_ABOVE = -1e30


def _mask_row(causal: bool) -> str:
    """Source of the padding trim (:data:`_MASK_ROW`) for a causal kernel or not."""
    def column(index: str) -> str:
        return _PADDED_COLUMN.format(index=index, masked=MASKED_AT_MOST)
    return _MASK_ROW.format(tail=column("keys - 1"), head=column("first"), kept=KEPT_ABOVE,
                            seen="min(keys, r0 + i + 1)" if causal else "keys")


def _arguments(masked: bool) -> str:
    """The kernel's arguments after its five buffers: the mask and its parameters last."""
    return f", mask, {PARAMS}, {MASK_PARAMS}" if masked else f", {PARAMS}"


def _row_max(f: str, mask_key: str | None) -> str:
    """Source of one row's maximum over its ``seen`` scores, the mask added first (a
    loop of its own, which vectorises: the max's loop carries its combine)."""
    top = """            for j in range(seen):
                top = lib.max_combine(top, tile[np.uint64(row + j)])
"""
    if mask_key is None:
        return top
    return f"""            mrow = m0 + i*m_sl
            for j in range(seen):
                tile[np.uint64(row + j)] += mask[np.uint64({mask_key})]
{top}            if top == {f}(-np.inf):  # masked whole: exps 0, sum 1 (output 0, lse 0)
                top = {f}(0.0)
"""


def attention(dtype: str, causal: bool, scale: float | None, masked: bool = False,
              mask_key_stride: int | None = None) -> str:
    """The kernel source for one dtype (numpy name), causal or not, softmax scale (None:
    eager's default, from the head dim), and with an additive mask (its key stride, if
    known: :data:`_MASK_KEY`) or without."""
    f = f"np.{dtype}"
    mask_key = _MASK_KEY.get(mask_key_stride, _MASK_KEY[None]) if masked else None
    keys = "min(S, r0 + rows)" if causal else "S"
    # the keys row i sees: up to its own (causal), counted from the block's first
    seen = "max(min(keys, r0 + i + 1) - first, 0)" if causal else "nk"
    mask_row = _mask_row(causal) if masked else ""
    empty_sum = (f"            total = {f}(1.0) if total == 0 else total\n"
                 if masked else "")
    return f"""from simaccel.codegen.blas_lib import (AS_STORED, TRANSPOSED, blas_threads_local,
                                        gemm)


def kernel(out, lse, q, k, v{_arguments(masked)}):
    blocks = (L + BQ - 1) // BQ
    scale = {_scale_source(dtype, scale)}
    size = q.itemsize
    for t in prange(B * H * blocks):
        threads = blas_threads_local(1)  # the GEMMs single-threaded under any layer
        bh = t // blocks
        b = bh // H
        h = bh % H
        r0 = (t % blocks) * BQ
        rows = min(BQ, L - r0)
        keys = {keys}
        first = 0
{mask_row}        nk = keys - first
        tile = np.empty(rows * nk, q.dtype)
        sums = np.empty(rows, q.dtype)
        qa = q.ctypes.data + (q_off + b*q_sb + h*q_sh + r0*q_sl) * size
        ka = k.ctypes.data + (k_off + b*k_sb + (h // G)*k_sh + first*k_sl) * size
        va = v.ctypes.data + (v_off + b*v_sb + (h // G)*v_sh + first*v_sl) * size
        o0 = b*o_sb + h*o_sh + r0*o_sl
        # tile (rows x nk, row-major) = scale * q_block @ k^T: column-major k q^T
        gemm(TRANSPOSED, AS_STORED, nk, rows, D, scale, ka, k_sl, qa, q_sl,
             tile.ctypes.data, nk)
        for i in range(rows):
            seen = {seen}
            row = i * nk
            top = {f}(-np.inf)
{_row_max(f, mask_key)}            total = {f}(0.0)
            for j in range(seen):
                e = lib.vexp(tile[np.uint64(row + j)] - top)
                tile[np.uint64(row + j)] = e
                total = lib.reassoc_add(total, e)
            for j in range(seen, nk):
                tile[np.uint64(row + j)] = 0
{empty_sum}            sums[i] = total
            lse[bh*L + r0 + i] = top + np.log(total)
        # out rows (rows x DV) = tile @ v: column-major v^T tile^T
        gemm(AS_STORED, AS_STORED, DV, rows, nk, {f}(1.0), va, v_sl, tile.ctypes.data,
             nk, out.ctypes.data + o0 * size, o_sl)
        for i in range(rows):
            inv = {f}(1.0) / sums[i]
            base = o0 + i*o_sl
            for d in range(DV):
                out[np.uint64(base + d)] = out[np.uint64(base + d)] * inv
        blas_threads_local(threads)
"""


def attention_numpy(dtype: str, causal: bool, scale: float | None,
                    masked: bool = False) -> str:
    """The kernel's tier-0 form (numpy, the same arguments): batched products over every
    head at once, run while numba compiles :func:`attention`."""
    causal_mask = ("    scores = np.where(np.tri(L, S, dtype=bool), scores, -np.inf)\n"
                   if causal else "")
    add_mask = ("    scores += strided(mask[m_off:], (B, H, L, S),\n"
                "                      (m_sb*size, m_sh*size, m_sl*size, m_ss*size))\n"
                if masked else "")
    # a row masked whole: exps 0 and sum 1, so output 0 and logsumexp 0 (as eager's op)
    masked_rows = ("    top = np.where(top == -np.inf, q.dtype.type(0.0), top)\n"
                   if masked else "")
    empty_sums = ("    total = np.where(total == 0, q.dtype.type(1.0), total)\n"
                  if masked else "")
    return f"""def kernel(out, lse, q, k, v{_arguments(masked)}):
    size = q.itemsize
    strided = np.lib.stride_tricks.as_strided
    Q = strided(q[q_off:], (B, H, L, D), (q_sb*size, q_sh*size, q_sl*size, size))
    # each key and value head read by the G query heads of its group (stride 0)
    K = strided(k[k_off:], (B, H // G, G, S, D),
                (k_sb*size, k_sh*size, 0, k_sl*size, size)).reshape(B, H, S, D)
    V = strided(v[v_off:], (B, H // G, G, S, DV),
                (v_sb*size, v_sh*size, 0, v_sl*size, size)).reshape(B, H, S, DV)
    O = strided(out, (B, H, L, DV), (o_sb*size, o_sh*size, o_sl*size, size))
    scores = np.matmul(Q, K.swapaxes(2, 3)) * {_scale_source(dtype, scale)}
{add_mask}{causal_mask}    top = scores.max(axis=3, keepdims=True)
{masked_rows}    exps = np.exp(scores - top)
    total = exps.sum(axis=3, keepdims=True)
{empty_sums}    O[...] = np.matmul(exps, V) * (q.dtype.type(1.0) / total)
    lse[:B*H*L] = (top + np.log(total)).reshape(-1)
"""
