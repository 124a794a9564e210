"""Loop-invariant code motion for emitted kernels: values that do not change inside the
loops (a lifted scalar read from the constant bank, a 0-d input, its conversions) are
computed once, before the loops.

Why here and not in LLVM: every buffer is a separate numba array argument, and LLVM
cannot prove that a store into one does not overwrite another, so a load like
``bank[0]`` stays inside a loop that stores, converted again for every element. Measured
on GPT-2's masked softmax row kernel (512 rows of 64, the lifted ``attn_scale_factor``
read in two passes): 56 -> 49 us with the load and its conversions hoisted.

The pass works on the kernel body as the emitters write it (one statement per line,
blocks by indentation): a line ``name = <expression>`` moves to the top of the kernel
when the expression reads only constants, pure helpers (``np.*``, ``lib.*``, ``math.*``),
names already moved, and elements at constant positions of buffers the kernel never
stores into; ``name`` is assigned nowhere else; and every loop around it has a static,
non-zero trip count (so the hoisted load reads an element the loop would have read, never
one of an empty buffer).
"""
from __future__ import annotations

import ast
import re
from collections.abc import Sequence

#: an element read at a fixed position, ``buf[np.uint64(0)]`` (emit.index_source)
_CONSTANT_POSITION = re.compile(r"\[np\.uint64\(\d+\)\]")
#: modules whose functions kernels call; all of them pure
PURE_MODULES = frozenset({"np", "lib", "math", "numba"})
#: the builtins emitted index and mask expressions call (``bool(0 <= i < n)``, clamps)
PURE_BUILTINS = frozenset({"bool", "min", "max", "abs", "int", "float"})


def hoist_invariants(body: Sequence[str], buffers: Sequence[str]) -> list[str]:
    """``body`` (a kernel's statements, one per line, at an indent of 4 spaces) with its
    loop-invariant assignments first; ``buffers``: the kernel's array arguments."""
    if not any(_CONSTANT_POSITION.search(line) for line in body):
        return list(body)  # no element read at a fixed position: constants LLVM folds
    try:
        tree = ast.parse("def kernel():\n" + "\n".join(body))
    except SyntaxError:
        return list(body)
    function = tree.body[0]
    written, assigned = _stores(function)
    moving = _Motion(body, frozenset(buffers) - written, assigned)
    moving.visit(function.body, loops=0, movable=True)  # type: ignore[attr-defined]
    lines = [k - 2 for k in moving.lines]  # line 1 is the def
    hoisted = set(lines)
    return (["    " + body[k].strip() for k in lines]
            + [line for k, line in enumerate(body) if k not in hoisted])


class _Motion:
    """The statements of ``body`` to move, in order (``lines``: their line numbers in the
    parsed function, whose line 1 is the ``def``); ``known``: the names they bind."""

    def __init__(self, body: Sequence[str], readable: frozenset[str],
                 assigned: dict[str, int]) -> None:
        self.body = body
        self.readable = readable
        self.assigned = assigned
        self.known: set[str] = set()
        self.lines: list[int] = []

    def visit(self, statements: list[ast.stmt], loops: int, movable: bool) -> None:
        """``loops``: loops around ``statements``; ``movable``: all of them run their
        body (static, non-zero trip counts) and no conditional is in between."""
        for statement in statements:
            if isinstance(statement, ast.For):
                self.visit(statement.body, loops + 1, movable and _static_loop(statement))
            elif isinstance(statement, ast.If):
                self.visit(statement.body, loops, False)
                self.visit(statement.orelse, loops, False)
            elif loops and movable and _alone_on_its_line(statement, self.body) \
                    and _invariant(statement, self.readable, self.known) \
                    and self.assigned[statement.targets[0].id] == 1:  # type: ignore[attr-defined]
                self.known.add(statement.targets[0].id)  # type: ignore[attr-defined]
                self.lines.append(statement.lineno)


def _alone_on_its_line(statement: ast.stmt, body: Sequence[str]) -> bool:
    """True for a statement on one line of ``body``, alone (not ``a = 1; b = 2``): a
    moved line carries exactly the statement (kernels hold no string literals)."""
    return statement.end_lineno == statement.lineno and ";" not in body[statement.lineno - 2]


def _stores(function: ast.AST) -> tuple[frozenset[str], dict[str, int]]:
    """(names stored into by subscript, ``buf[i] = v``; how often each plain name is
    bound: assignments, augmented ones, loop variables), in one walk of the tree."""
    written: set[str] = set()
    counts: dict[str, int] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            counts[node.id] = counts.get(node.id, 0) + 1
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name):
            written.add(node.value.id)
    return frozenset(written), counts


def _static_loop(loop: ast.For) -> bool:
    """True for a ``for v in range(N)`` / ``prange(N)`` with a literal N > 0 (a dynamic
    loop may not run its body)."""
    it = loop.iter
    return (isinstance(it, ast.Call) and isinstance(it.func, ast.Name)
            and it.func.id in ("range", "prange") and len(it.args) == 1
            and isinstance(it.args[0], ast.Constant) and type(it.args[0].value) is int
            and it.args[0].value > 0)


def _invariant(statement: ast.stmt, readable: frozenset[str], known: set[str]) -> bool:
    """True for ``name = expr`` where ``expr`` reads only what the loops do not change."""
    if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)):
        return False
    return _pure(statement.value, readable, known)


def _pure(node: ast.expr, readable: frozenset[str], known: set[str]) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Name):
        return node.id in known
    if isinstance(node, ast.Attribute):  # a module's constant: np.inf
        return _pure_function(node)
    if isinstance(node, ast.Subscript):  # an element of a buffer at an invariant position
        return (isinstance(node.value, ast.Name) and node.value.id in readable
                and _pure(node.slice, readable, known))
    if isinstance(node, ast.Call):
        return (_pure_function(node.func) and not node.keywords
                and all(_pure(a, readable, known) for a in node.args))
    if isinstance(node, ast.UnaryOp):
        return _pure(node.operand, readable, known)
    if isinstance(node, ast.BinOp):
        return _pure(node.left, readable, known) and _pure(node.right, readable, known)
    if isinstance(node, (ast.Compare, ast.BoolOp, ast.IfExp)):
        return all(_pure(c, readable, known) for c in ast.iter_child_nodes(node)
                   if isinstance(c, ast.expr))
    return False


def _pure_function(func: ast.expr) -> bool:
    """``np.float32``, ``lib.vexp``, ``np.uint64``...: a function of a pure module, or
    a pure builtin (``min``)."""
    if isinstance(func, ast.Name):
        return func.id in PURE_BUILTINS
    while isinstance(func, ast.Attribute):
        func = func.value
    return isinstance(func, ast.Name) and func.id in PURE_MODULES


def hoist_out_of_loops(body: Sequence[str], buffers: Sequence[str]) -> list[str]:
    """``body`` (as :func:`hoist_invariants` takes it) with each statement that does not
    change inside the loop around it moved before that loop, as far out as it stays
    invariant: a per-row value of a pointwise kernel over rows and columns (a row's
    maximum, its exp and its sum, loaded and computed once per row, not per element).
    Measured on causal attention's combining kernel (4x8x128x64 out, two exps per row):
    89 -> 43 us. The same rules as :func:`hoist_invariants`: only single assignments of
    pure expressions over buffers the kernel never stores into, out of static loops of
    a non-zero trip count, never out of a conditional."""
    lines = list(body)
    while True:
        moved = _hoist_one_level(lines, buffers)
        if moved is None:
            return lines
        lines = moved


def _hoist_one_level(lines: list[str], buffers: Sequence[str]) -> list[str] | None:
    """``lines`` with every movable statement moved out of the loop it is directly in,
    or None when none is."""
    try:
        function = ast.parse("def kernel():\n" + "\n".join(lines)).body[0]
    except SyntaxError:
        return None
    written, assigned = _stores(function)
    readable = frozenset(buffers) - written
    before: dict[int, list[int]] = {}  # loop line -> the lines moved before it
    for loop in ast.walk(function):
        if isinstance(loop, ast.For) and _static_loop(loop):
            moving = _invariant_children(loop, lines, readable, assigned)
            if moving:
                before[loop.lineno - 2] = [k - 2 for k in moving]
    if not before:
        return None
    gone = {k for moved in before.values() for k in moved}
    out: list[str] = []
    for k, line in enumerate(lines):
        indent = line[:len(line) - len(line.lstrip())]
        out += [indent + lines[m].strip() for m in before.get(k, [])]
        if k not in gone:
            out.append(line)
    return out


def _invariant_children(loop: ast.For, lines: Sequence[str], readable: frozenset[str],
                        assigned: dict[str, int]) -> list[int]:
    """Line numbers (parsed, def = 1) of the statements directly in ``loop`` that read
    nothing the loop changes: names bound inside it stay varying unless moved."""
    bound_inside = {n.id for n in ast.walk(loop)
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    moved: set[str] = set()
    found: list[int] = []
    for statement in loop.body:
        if isinstance(statement, (ast.For, ast.If)):
            continue
        known = _Outside(bound_inside, moved)
        if _alone_on_its_line(statement, lines) and _invariant(statement, readable, known) \
                and assigned[statement.targets[0].id] == 1:  # type: ignore[attr-defined]
            moved.add(statement.targets[0].id)  # type: ignore[attr-defined]
            found.append(statement.lineno)
    return found


class _Outside:
    """The names an invariant statement may read: any not bound inside the loop, and
    those of statements already moved out of it."""

    def __init__(self, bound_inside: set[str], moved: set[str]) -> None:
        self.bound_inside, self.moved = bound_inside, moved

    def __contains__(self, name: object) -> bool:
        return name not in self.bound_inside or name in self.moved

