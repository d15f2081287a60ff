"""The conditions of a MERGE's clauses, evaluated over Arrow columns.

The local engine's own MERGE (:mod:`pipelines.engines.direct_merge`) evaluates a clause's
condition -- the SQL text every engine's ``merge`` takes, such as
``(target._cdc_order_key IS NULL OR source._cdc_order_key > target._cdc_order_key)`` -- over
the matched target rows and the source rows they matched, side by side. It understands the
part of SQL the pipeline's conditions use:

- columns of either side: ``source.<name>`` / ``target.<name>`` (a name bare, in double quotes
  or in backticks; a bare name that is not a column is looked up without regard to case);
- literals: ``true``, ``false``, ``null``, numbers, ``'text'``;
- ``=``, ``!=``, ``<>``, ``<``, ``<=``, ``>``, ``>=``, ``IS [NOT] NULL``, ``NOT``, ``AND``,
  ``OR`` and parentheses, with SQL's three-valued logic (a clause applies where its condition
  is true, not where it is null).

:func:`parse_condition` raises :class:`UnsupportedCondition` for anything else (or for a
column neither side has, or types that do not compare); the caller then lets delta-rs run
the MERGE.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Condition", "UnsupportedCondition", "parse_condition"]


class UnsupportedCondition(ValueError):
    """A condition this evaluator does not understand (the MERGE goes to delta-rs)."""


_TOKEN = re.compile(
    r"""\s*(?:
        (?P<number>-?\d+(?:\.\d+)?)
      | '(?P<text>(?:[^']|'')*)'
      | "(?P<quoted>(?:[^"]|"")+)"
      | `(?P<ticked>(?:[^`]|``)+)`
      | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<op><>|!=|<=|>=|=|<|>|\(|\)|\.)
    )""",
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "not", "is", "null", "true", "false"}
_COMPARE: dict[str, Callable[..., object]] = {
    "=": pc.equal,
    "!=": pc.not_equal,
    "<>": pc.not_equal,
    "<": pc.less,
    "<=": pc.less_equal,
    ">": pc.greater,
    ">=": pc.greater_equal,
}

# A value while evaluating: an array of the rows, or a scalar (a literal).
_Value = Any
_Node = Callable[[pa.Table, pa.Table], _Value]


@dataclass(frozen=True)
class _Token:
    kind: str  # number, text, name (quoted or bare), keyword, op
    value: str


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    position = 0
    text = text.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise UnsupportedCondition(f"cannot read {text[position:]!r}")
        position = match.end()
        kind = match.lastgroup
        assert kind is not None
        value = match.group(kind)
        if kind == "word":
            if value.lower() in _KEYWORDS:
                out.append(_Token("keyword", value.lower()))
            else:
                out.append(_Token("bare", value))
        elif kind == "quoted":
            out.append(_Token("name", value.replace('""', '"')))
        elif kind == "ticked":
            out.append(_Token("name", value.replace("``", "`")))
        elif kind == "text":
            out.append(_Token("text", value.replace("''", "'")))
        else:
            out.append(_Token(kind, value))
    return out


class Condition:
    """A parsed condition: call it with the matched target rows and the source rows they
    matched (equal lengths) for the mask of rows where it holds (never null)."""

    def __init__(self, text: str, node: _Node) -> None:
        self.text = text
        self._node = node

    def __call__(self, target: pa.Table, source: pa.Table) -> pa.Array:
        value = self._node(target, source)
        if isinstance(value, pa.Scalar):
            if not pa.types.is_boolean(value.type) and not pa.types.is_null(value.type):
                raise UnsupportedCondition(f"{self.text!r} is not a condition")
            value = pa.array([value.as_py()] * target.num_rows, pa.bool_())
        if not pa.types.is_boolean(value.type):
            raise UnsupportedCondition(f"{self.text!r} is not a condition")
        return pc.fill_null(value, False)


class _Parser:
    def __init__(self, text: str, target: pa.Schema, source: pa.Schema) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.at = 0
        self.sides = {"target": target, "source": source}

    def peek(self) -> _Token | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, kind: str | None = None, value: str | None = None) -> _Token | None:
        token = self.peek()
        if token is None or (kind and token.kind != kind) or (value and token.value != value):
            return None
        self.at += 1
        return token

    def expect(self, kind: str, value: str) -> None:
        if self.take(kind, value) is None:
            raise UnsupportedCondition(f"expected {value!r} in {self.text!r}")

    def parse(self) -> _Node:
        node = self.disjunction()
        if self.peek() is not None:
            raise UnsupportedCondition(f"unexpected {self.peek()} in {self.text!r}")
        return node

    def disjunction(self) -> _Node:
        node = self.conjunction()
        while self.take("keyword", "or"):
            left, right = node, self.conjunction()
            node = _binary(pc.or_kleene, left, right)
        return node

    def conjunction(self) -> _Node:
        node = self.negation()
        while self.take("keyword", "and"):
            left, right = node, self.negation()
            node = _binary(pc.and_kleene, left, right)
        return node

    def negation(self) -> _Node:
        if self.take("keyword", "not"):
            inner = self.negation()
            return lambda t, s: pc.invert(inner(t, s))
        return self.comparison()

    def comparison(self) -> _Node:
        left = self.operand()
        if self.take("keyword", "is"):
            negated = self.take("keyword", "not") is not None
            self.expect("keyword", "null")
            test = pc.is_valid if negated else pc.is_null
            return lambda t, s: test(left(t, s))
        op = self.peek()
        if op is not None and op.kind == "op" and op.value in _COMPARE:
            self.at += 1
            right = self.operand()
            return _binary(_COMPARE[op.value], left, right)
        return left

    def operand(self) -> _Node:
        token = self.peek()
        if token is None:
            raise UnsupportedCondition(f"{self.text!r} ends too early")
        self.at += 1
        if token.kind == "op" and token.value == "(":
            node = self.disjunction()
            self.expect("op", ")")
            return node
        if token.kind == "keyword" and token.value in ("true", "false", "null"):
            literal = pa.scalar(None if token.value == "null" else token.value == "true")
            return lambda t, s: literal
        if token.kind == "number":
            number = pa.scalar(float(token.value) if "." in token.value else int(token.value))
            return lambda t, s: number
        if token.kind == "text":
            text = pa.scalar(token.value)
            return lambda t, s: text
        if token.kind == "bare" and token.value.lower() in self.sides and self.take("op", "."):
            return self.column(token.value.lower())
        raise UnsupportedCondition(f"cannot use {token.value!r} in {self.text!r}")

    def column(self, side: str) -> _Node:
        token = self.take("name") or self.take("bare")
        if token is None:
            raise UnsupportedCondition(f"a column name must follow {side}. in {self.text!r}")
        names = self.sides[side].names
        name = token.value
        if name not in names and token.kind == "bare":
            folded = [n for n in names if n.lower() == name.lower()]
            name = folded[0] if len(folded) == 1 else name
        if name not in names:
            raise UnsupportedCondition(f"{side} has no column {token.value!r}")
        if side == "target":
            return lambda t, s: t.column(name).combine_chunks()
        return lambda t, s: s.column(name).combine_chunks()


def _binary(function: Callable[..., object], left: _Node, right: _Node) -> _Node:
    def node(t: pa.Table, s: pa.Table) -> _Value:
        a, b = left(t, s), right(t, s)
        if isinstance(a, pa.Scalar) and isinstance(b, pa.Scalar):
            # Two literals: evaluate once, then as a row-long array.
            return pa.array([function(a, b).as_py()] * t.num_rows)  # type: ignore[attr-defined]
        return function(a, b)

    return node


def parse_condition(text: str, target: pa.Schema, source: pa.Schema) -> Condition:
    """``text`` as a :class:`Condition` over rows of ``target`` and ``source``; checked on
    no rows first, so a condition whose types do not compare is refused here, not midway
    through a MERGE."""
    condition = Condition(text, _Parser(text, target, source).parse())
    try:
        condition(target.empty_table(), source.empty_table())
    except (pa.ArrowException, TypeError) as exc:
        raise UnsupportedCondition(f"{text!r}: {exc}") from exc
    return condition
