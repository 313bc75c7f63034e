"""Shape expressions ("2*F", "d // head_dim") over a shape set's model dimensions."""

from __future__ import annotations

import ast
import operator

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def symbols(expr: str) -> set[str]:
    """The dimension names an expression uses; ValueError if it is not a plain integer expression."""
    tree = _parse(expr)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def evaluate(expr: str, dims: dict[str, int]) -> int:
    """The integer value of an expression such as "2*F" for the given dimensions."""
    return _eval(_parse(expr).body, dims, expr)


def _parse(expr: str) -> ast.Expression:
    try:
        tree = ast.parse(str(expr), mode="eval")
    except SyntaxError:
        raise ValueError(f"not a dimension expression: {expr!r}") from None
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Expression, ast.BinOp, ast.Name, ast.Constant, ast.Load, *_OPS)):
            raise ValueError(f"not a dimension expression: {expr!r} (use names, integers, + - * //)")
        if isinstance(node, ast.Constant) and not isinstance(node.value, int):
            raise ValueError(f"not a dimension expression: {expr!r} (integers only)")
    return tree


def _eval(node, dims, expr):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in dims:
            raise ValueError(f"unknown dimension {node.id!r} in {expr!r}")
        return dims[node.id]
    return _OPS[type(node.op)](_eval(node.left, dims, expr), _eval(node.right, dims, expr))
