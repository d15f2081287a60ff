"""The SOQL subset of PushTopic queries: a tokenizer, a parser and an evaluator.

Accepted::

    SELECT <field>, <field>, ... FROM <Object> [WHERE <condition>] [;]

    condition := term (OR term)*          term := atom (AND atom)*
    atom      := ( condition )
               | <field> = | != | <> | < | <= | > | >= <literal>
               | <field> [NOT] IN ( <literal>, ... )
               | <field> LIKE '<pattern>'             (% any run, _ one character)
               | <field> INCLUDES | EXCLUDES ( '<value>', ... )   (multi-select picklists)
    literal   := 'text' | 12 | -3.5 | TRUE | FALSE | NULL | 2011-06-14 | 2011-06-14T10:00:00Z

What the Streaming API refuses, with its error text: aggregates and ``COUNT``, ``GROUP BY``,
``LIMIT``, ``ORDER BY``, ``OFFSET``, ``TYPEOF``, relationship fields (``Account.Name``),
semi-joins and anti-joins (``IN (SELECT ...)``) and ``NOT``. String comparisons ignore case, as
SOQL's do; a comparison with a null value is false except ``= NULL`` / ``!= NULL``.

Names are checked against the object's fields by :mod:`ingest.emulator.cometd.fields`;
this module only knows the grammar. Values are compared in a normalized form the caller
provides (dates and datetimes as epoch milliseconds).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

__all__ = [
    "And",
    "Compare",
    "Condition",
    "InList",
    "Includes",
    "Like",
    "Or",
    "Query",
    "SoqlError",
    "condition_fields",
    "evaluate",
    "parse_query",
]

Op = Literal["=", "!=", "<", "<=", ">", ">="]


class SoqlError(Exception):
    """A query the PushTopic subset does not accept. ``code`` is Salesforce's errorCode."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class DateLiteral:
    """A date literal (``2011-06-14``) as epoch milliseconds at midnight UTC."""

    epoch_ms: int
    text: str


@dataclass(frozen=True, slots=True)
class DateTimeLiteral:
    """A datetime literal (``2011-06-14T10:00:00Z``) as epoch milliseconds."""

    epoch_ms: int
    text: str


@dataclass(frozen=True, slots=True)
class Compare:
    field: str
    op: Op
    value: Any


@dataclass(frozen=True, slots=True)
class InList:
    field: str
    values: tuple[Any, ...]
    negated: bool


@dataclass(frozen=True, slots=True)
class Like:
    field: str
    pattern: str


@dataclass(frozen=True, slots=True)
class Includes:
    field: str
    values: tuple[str, ...]
    negated: bool


@dataclass(frozen=True, slots=True)
class And:
    items: tuple[Condition, ...]


@dataclass(frozen=True, slots=True)
class Or:
    items: tuple[Condition, ...]


Condition = Compare | InList | Like | Includes | And | Or


@dataclass(frozen=True, slots=True)
class Query:
    """A parsed PushTopic query: selected field names (as written), the object, the filter."""

    fields: tuple[str, ...]
    entity: str
    where: Condition | None


_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<string>'(?:[^'\\]|\\.)*')
  | (?P<datetime>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,3})?(?:Z|[+-]\d{2}:?\d{2}))
  | (?P<date>\d{4}-\d{2}-\d{2})
  | (?P<number>-?\d+(?:\.\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op><=|>=|!=|<>|=|<|>)
  | (?P<punct>[(),.;])
    """,
    re.VERBOSE,
)
_AGGREGATES = frozenset({"AVG", "MAX", "MIN", "SUM", "COUNT", "COUNT_DISTINCT"})
_CLAUSES = {
    "LIMIT": "'LIMIT' is not allowed",
    "ORDER": "'ORDER BY' clause is not allowed",
    "OFFSET": "'OFFSET' clause is not allowed",
    "GROUP": "Aggregate queries are not supported",
    "HAVING": "Aggregate queries are not supported",
}
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "'": "'", '"': '"', "\\": "\\"}


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str
    text: str
    upper: str


def _tokens(soql: str) -> list[_Tok]:
    out: list[_Tok] = []
    pos = 0
    while pos < len(soql):
        match = _TOKEN.match(soql, pos)
        if match is None:
            raise SoqlError(
                "MALFORMED_QUERY", f"unexpected character {soql[pos]!r} at position {pos}"
            )
        pos = match.end()
        kind = match.lastgroup or ""
        if kind != "ws":
            text = match.group()
            out.append(_Tok(kind, text, text.upper()))
    return out


def _unquote(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


def _datetime_ms(text: str) -> int:
    value = text.replace("Z", "+00:00")
    if re.search(r"[+-]\d{4}$", value):
        value = value[:-2] + ":" + value[-2:]
    moment = datetime.fromisoformat(value)
    return round(moment.astimezone(timezone.utc).timestamp() * 1000)


class _Parser:
    def __init__(self, soql: str) -> None:
        self.toks = _tokens(soql)
        self.i = 0

    def peek(self, offset: int = 0) -> _Tok | None:
        j = self.i + offset
        return self.toks[j] if j < len(self.toks) else None

    def take(self) -> _Tok:
        tok = self.peek()
        if tok is None:
            raise SoqlError("MALFORMED_QUERY", "unexpected end of query")
        self.i += 1
        return tok

    def expect_word(self, word: str) -> None:
        tok = self.take()
        if tok.upper != word:
            raise SoqlError("MALFORMED_QUERY", f"expected {word} (got {tok.text!r})")

    def expect(self, text: str) -> None:
        tok = self.take()
        if tok.text != text:
            raise SoqlError("MALFORMED_QUERY", f"expected {text!r} (got {tok.text!r})")

    def query(self) -> Query:
        self.expect_word("SELECT")
        fields = [self.select_field()]
        while (tok := self.peek()) is not None and tok.text == ",":
            self.take()
            fields.append(self.select_field())
        self.expect_word("FROM")
        entity = self.take()
        if entity.kind != "name":
            raise SoqlError("MALFORMED_QUERY", f"expected an object name (got {entity.text!r})")
        self.no_relationship(entity)
        where: Condition | None = None
        tok = self.peek()
        if tok is not None and tok.upper == "WHERE":
            self.take()
            where = self.condition()
        self.trailing()
        return Query(tuple(fields), entity.text, where)

    def select_field(self) -> str:
        tok = self.take()
        if tok.upper == "TYPEOF":
            raise SoqlError("INVALID_FIELD", "'TYPEOF' clause is not allowed")
        if tok.kind != "name":
            raise SoqlError("MALFORMED_QUERY", f"expected a field name (got {tok.text!r})")
        nxt = self.peek()
        if nxt is not None and nxt.text == "(":
            if tok.upper in _AGGREGATES:
                raise SoqlError("INVALID_FIELD", "Aggregate queries are not supported")
            raise SoqlError("INVALID_FIELD", f"function {tok.text}() is not supported")
        self.no_relationship(tok)
        return tok.text

    def no_relationship(self, tok: _Tok) -> None:
        nxt = self.peek()
        if nxt is not None and nxt.text == ".":
            raise SoqlError("INVALID_FIELD", "relationships are not supported")

    def trailing(self) -> None:
        tok = self.peek()
        if tok is not None and tok.text == ";":
            self.take()
            tok = self.peek()
        if tok is None:
            return
        message = _CLAUSES.get(tok.upper)
        if message is not None:
            raise SoqlError("INVALID_FIELD", message)
        raise SoqlError("MALFORMED_QUERY", f"unexpected token {tok.text!r}")

    def condition(self) -> Condition:
        items = [self.term()]
        while (tok := self.peek()) is not None and tok.upper == "OR":
            self.take()
            items.append(self.term())
        return items[0] if len(items) == 1 else Or(tuple(items))

    def term(self) -> Condition:
        items = [self.atom()]
        while (tok := self.peek()) is not None and tok.upper == "AND":
            self.take()
            items.append(self.atom())
        return items[0] if len(items) == 1 else And(tuple(items))

    def atom(self) -> Condition:
        tok = self.take()
        if tok.text == "(":
            inner = self.condition()
            self.expect(")")
            return inner
        if tok.upper == "NOT":
            raise SoqlError("INVALID_FIELD", "'NOT' is not supported")
        if tok.kind != "name":
            raise SoqlError("MALFORMED_QUERY", f"expected a field name (got {tok.text!r})")
        self.no_relationship(tok)
        field = tok.text
        op = self.take()
        if op.kind == "op":
            text = "!=" if op.text == "<>" else op.text
            return Compare(field, text, self.literal())  # type: ignore[arg-type]
        if op.upper == "LIKE":
            pattern = self.literal()
            if not isinstance(pattern, str):
                raise SoqlError("MALFORMED_QUERY", f"LIKE needs a quoted pattern (got {pattern!r})")
            return Like(field, pattern)
        negated = False
        if op.upper == "NOT":
            negated = True
            op = self.take()
            if op.upper != "IN":
                raise SoqlError("INVALID_FIELD", "'NOT' is not supported")
        if op.upper in ("IN", "INCLUDES", "EXCLUDES"):
            values = self.values()
            if op.upper == "IN":
                return InList(field, values, negated)
            texts = tuple(v for v in values if isinstance(v, str))
            if len(texts) != len(values):
                raise SoqlError("MALFORMED_QUERY", f"{op.upper} takes quoted values only")
            return Includes(field, texts, op.upper == "EXCLUDES")
        raise SoqlError("MALFORMED_QUERY", f"expected an operator after {field} (got {op.text!r})")

    def values(self) -> tuple[Any, ...]:
        self.expect("(")
        first = self.peek()
        if first is not None and first.upper == "SELECT":
            raise SoqlError("INVALID_FIELD", "semi/anti join sub-selects are not supported")
        out = [self.literal()]
        while (tok := self.peek()) is not None and tok.text == ",":
            self.take()
            out.append(self.literal())
        self.expect(")")
        return tuple(out)

    def literal(self) -> Any:
        tok = self.take()
        if tok.kind == "string":
            return _unquote(tok.text)
        if tok.kind == "number":
            return float(tok.text) if "." in tok.text else int(tok.text)
        if tok.kind == "date":
            try:
                ms = _datetime_ms(tok.text + "T00:00:00Z")
            except ValueError as exc:
                raise SoqlError("MALFORMED_QUERY", f"invalid date {tok.text!r}") from exc
            return DateLiteral(ms, tok.text)
        if tok.kind == "datetime":
            try:
                return DateTimeLiteral(_datetime_ms(tok.text), tok.text)
            except ValueError as exc:
                raise SoqlError("MALFORMED_QUERY", f"invalid datetime {tok.text!r}") from exc
        if tok.upper in ("TRUE", "FALSE"):
            return tok.upper == "TRUE"
        if tok.upper == "NULL":
            return None
        raise SoqlError("MALFORMED_QUERY", f"expected a value (got {tok.text!r})")


def parse_query(soql: str) -> Query:
    """Parse a PushTopic query; :class:`SoqlError` names what is not accepted."""
    if not isinstance(soql, str) or not soql.strip():
        raise SoqlError("MALFORMED_QUERY", "expected a SOQL query")
    return _Parser(soql).query()


def condition_fields(cond: Condition | None) -> Iterator[str]:
    """Every field name a condition mentions, in order (with repeats)."""
    if cond is None:
        return
    if isinstance(cond, And | Or):
        for item in cond.items:
            yield from condition_fields(item)
    else:
        yield cond.field


def _norm(value: Any) -> Any:
    if isinstance(value, DateLiteral | DateTimeLiteral):
        return value.epoch_ms
    if isinstance(value, str):
        return value.casefold()
    return value


def _like(pattern: str) -> re.Pattern[str]:
    parts = [".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern]
    return re.compile("".join(parts), re.IGNORECASE | re.DOTALL)


def _compare(op: Op, left: Any, right: Any) -> bool:
    if right is None or left is None:
        if op == "=":
            return left is None and right is None
        if op == "!=":
            return (left is None) != (right is None)
        return False
    try:
        if op == "=":
            return bool(left == right)
        if op == "!=":
            return bool(left != right)
        if op == "<":
            return bool(left < right)
        if op == "<=":
            return bool(left <= right)
        if op == ">":
            return bool(left > right)
        return bool(left >= right)
    except TypeError:
        return False


def evaluate(cond: Condition | None, value_of: Callable[[str], Any]) -> bool:
    """Whether a record matches ``cond``; ``value_of(field)`` gives the record's value in the
    normalized form (dates and datetimes as epoch ms, ids as 18 characters)."""
    if cond is None:
        return True
    if isinstance(cond, And):
        return all(evaluate(c, value_of) for c in cond.items)
    if isinstance(cond, Or):
        return any(evaluate(c, value_of) for c in cond.items)
    value = _norm(value_of(cond.field))
    if isinstance(cond, Compare):
        return _compare(cond.op, value, _norm(cond.value))
    if isinstance(cond, InList):
        found = value is not None and any(value == _norm(v) for v in cond.values)
        return (not found) if cond.negated else found
    if isinstance(cond, Like):
        return isinstance(value, str) and _like(cond.pattern).fullmatch(value) is not None
    chosen = {v.casefold() for v in str(value or "").split(";") if v}
    hit = any(
        all(part.casefold() in chosen for part in option.split(";")) for option in cond.values
    )
    return (not hit) if cond.negated else hit
