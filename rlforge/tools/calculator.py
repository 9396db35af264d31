"""``calculator``: exact arithmetic on integers and decimals, evaluated from a parsed expression.

The model calls ``{"name": "calculator", "arguments": {"expression": "123456789 * 987654321"}}`` and
gets ``121932631112635269`` back.  Only numbers, ``+ - * / // % **``, unary signs and parentheses
are allowed (the expression is parsed with :mod:`ast`, never ``eval``-ed); integers stay exact
(Python integers), ``/`` gives a float unless it divides exactly.  Limits: expressions of at most
``config.max_length`` characters (default 512), exponents of at most 1000 and results of at most
``config.max_digits`` digits (default 4000).  A bad expression raises :class:`~rlforge.tools.base.ToolError`,
whose message is what the model reads.
"""

from __future__ import annotations

import ast
import operator
from typing import Any

from rlforge.tools.base import BaseTool, ToolError, ToolResponse
from rlforge.tools.registry import TOOLS

_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UN = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def evaluate(expression: str, max_digits: int = 4000) -> int | float:
    """The value of ``expression`` (see the module docstring).

    Raises:
        ToolError: syntax error, a name/call/other node, division by zero, an exponent above 1000,
            or a result of more than ``max_digits`` digits.
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ToolError(f"cannot parse {expression!r}: {e.msg}") from None

    def ev(node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UN:
            return _UN[type(node.op)](ev(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(b) > 1000:
                raise ToolError(f"exponent {b} is too large (at most 1000)")
            try:
                r = _BIN[type(node.op)](a, b)
            except ZeroDivisionError:
                raise ToolError("division by zero") from None
            except OverflowError:
                raise ToolError("result too large") from None
            if isinstance(r, int) and r.bit_length() > max_digits * 3.33:
                raise ToolError(f"result has more than {max_digits} digits")
            if isinstance(r, float) and r.is_integer() and isinstance(node.op, ast.Div) and abs(r) < 2**53:
                r = int(r)
            return r
        raise ToolError(f"only numbers and + - * / // % ** ( ) are allowed, found {type(node).__name__}")

    return ev(tree.body)


@TOOLS.register("calculator", "rlforge.tools.calculator.CalculatorTool")
class CalculatorTool(BaseTool):
    """Arithmetic on the model's ``expression`` argument; ``config``: ``max_length``, ``max_digits``."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        expr = parameters.get("expression")
        if not isinstance(expr, str):
            raise ToolError("missing string argument 'expression'")
        if len(expr) > int(self.config.get("max_length", 512)):
            raise ToolError(f"expression longer than {self.config.get('max_length', 512)} characters")
        value = evaluate(expr, int(self.config.get("max_digits", 4000)))
        return ToolResponse(str(value)), 0.0, {}
