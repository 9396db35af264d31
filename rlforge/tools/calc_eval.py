"""The calculator's evaluator, standard library only, so it also runs as a worker script (``python -I calc_eval.py``).

:func:`evaluate` walks the parsed expression and checks the size of every integer result BEFORE computing it:
``a * b`` may have ``bits(a) + bits(b)`` bits, ``a ** n`` ``n * bits(a)`` bits, ``a + b`` one more than the
larger; a bound above ``max_digits`` decimal digits is refused, so no step is slow (each operand and result has
at most ~13,300 bits at the default 4000 digits).  Exponents above 1000 are refused too.

As a worker, it reads one JSON request per line on stdin, ``{"expr": str, "max_digits": int}``, and writes
one JSON line, ``{"ok": str}`` or ``{"error": str}``; it exits at the end of stdin.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import sys

_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UN = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 1000


class CalcError(ValueError):
    """A bad or too large expression; the message is what the model reads."""


def _bound_bits(op: ast.operator, a: int | float, b: int | float) -> int:
    """An upper bound on the bits of ``a op b`` when both are integers (0 otherwise: floats overflow to an
    error instead of growing)."""
    if not (isinstance(a, int) and isinstance(b, int)):
        return 0
    la, lb = a.bit_length(), b.bit_length()
    if isinstance(op, ast.Mult):
        return la + lb
    if isinstance(op, ast.Pow):
        return 0 if b < 0 or abs(a) <= 1 else b * la
    return max(la, lb) + 1


def evaluate(expression: str, max_digits: int = 4000) -> int | float:
    """The value of ``expression`` (numbers, ``+ - * / // % **``, unary signs, parentheses).

    Raises:
        CalcError: syntax error, any other node (names, calls, ...), division by zero, an exponent above
            1000, or a result (final or intermediate) of more than ``max_digits`` digits, refused before it
            is computed; a float literal or result that overflows (``1e999``, ``1e308 * 10``: never ``inf``
            or ``nan``).
    """
    max_bits = math.ceil(max_digits * math.log2(10))
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as e:
        raise CalcError(f"cannot parse {expression!r}: {getattr(e, 'msg', e)}") from None

    def ev(node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            if isinstance(node.value, int) and node.value.bit_length() > max_bits:
                raise CalcError(f"a number has more than {max_digits} digits")
            if isinstance(node.value, float) and math.isinf(node.value):
                raise CalcError("a number is too large for a float")
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UN:
            return _UN[type(node.op)](ev(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(b) > MAX_EXPONENT:
                raise CalcError(f"exponent {b} is too large (at most {MAX_EXPONENT})")
            if _bound_bits(node.op, a, b) > max_bits:
                raise CalcError(f"result would have more than {max_digits} digits")
            try:
                r = _BIN[type(node.op)](a, b)
            except ZeroDivisionError:
                raise CalcError("division by zero") from None
            except OverflowError:
                raise CalcError("result too large") from None
            if isinstance(r, complex):
                raise CalcError("the result is not a real number")
            if isinstance(r, float) and not math.isfinite(r):  # 1e308 * 10 is inf, not an OverflowError
                raise CalcError("result too large")
            if isinstance(r, int) and r.bit_length() > max_bits:
                raise CalcError(f"result has more than {max_digits} digits")
            if isinstance(r, float) and r.is_integer() and isinstance(node.op, ast.Div) and abs(r) < 2**53:
                r = int(r)
            return r
        raise CalcError(f"only numbers and + - * / // % ** ( ) are allowed, found {type(node).__name__}")

    return ev(tree.body)


def serve() -> None:
    """The worker loop of the module docstring."""
    for line in sys.stdin:
        try:
            req = json.loads(line)
            ans = {"ok": str(evaluate(req["expr"], int(req["max_digits"])))}
        except CalcError as e:
            ans = {"error": str(e)}
        except Exception as e:  # noqa: BLE001 - anything else is reported, the worker lives on
            ans = {"error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(ans) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    sys.set_int_max_str_digits(0) if hasattr(sys, "set_int_max_str_digits") else None
    serve()
