"""Salesforce record ids: 15-char ids, their 18-char case-safe form, and a seeded factory.

A 15-char id is case-sensitive: ``<key prefix: 3><pod: 2><reserved '0'><number: 9 base62>``
(``001Dp00000AbCdE``). The key prefix names the object (``001`` Account, ``003`` Contact,
``006`` Opportunity, ``005`` User, ``00D`` Organization, ``012`` RecordType, ``00N`` custom
field, ``a0B``... custom objects). Because tools such as spreadsheets compare ids without case,
Salesforce appends a 3-char suffix that encodes where the upper-case letters are: for each
5-char chunk of the 15-char id, bit *j* is set when character *j* of the chunk is ``A``-``Z``,
and the 5-bit value indexes ``ABCDEFGHIJKLMNOPQRSTUVWXYZ012345``. The API always returns the
18-char form, so the emulator emits 18-char ids everywhere.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from types import MappingProxyType

__all__ = [
    "KEY_PREFIXES",
    "IdFactory",
    "assign_key_prefixes",
    "case_safe_suffix",
    "is_valid_id",
    "key_prefix",
    "to_15",
    "to_18",
]

KEY_PREFIXES: Mapping[str, str] = MappingProxyType(
    {
        "Account": "001",
        "Contact": "003",
        "User": "005",
        "Opportunity": "006",
        "RecordType": "012",
        "CustomField": "00N",
        "Organization": "00D",
        "Invoice__c": "a0B",
    }
)

_SUFFIX_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ012345"
_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_BASE62_SET = frozenset(_BASE62)
_NUMBER_WIDTH = 9
_NUMBER_SPACE = 62**_NUMBER_WIDTH


def _check_15(value: str) -> None:
    if not isinstance(value, str) or len(value) != 15 or not _BASE62_SET.issuperset(value):
        raise ValueError(
            f"a Salesforce id must be 15 characters of [0-9A-Za-z] (got {value!r}, "
            f"{len(value) if isinstance(value, str) else type(value).__name__})"
        )


def _suffix(id15: str) -> str:
    suffix = []
    for start in (0, 5, 10):
        bits = 0
        for j, ch in enumerate(id15[start : start + 5]):
            if "A" <= ch <= "Z":
                bits |= 1 << j
        suffix.append(_SUFFIX_ALPHABET[bits])
    return "".join(suffix)


def case_safe_suffix(id15: str) -> str:
    """The 3-char suffix that turns a 15-char id into its case-insensitive 18-char form."""
    _check_15(id15)
    return _suffix(id15)


def to_18(value: str) -> str:
    """The 18-char form of a 15- or 18-char id (an 18-char id must carry the right suffix)."""
    if isinstance(value, str) and len(value) == 18:
        expected = case_safe_suffix(value[:15])
        if value[15:].upper() != expected:
            raise ValueError(
                f"{value!r} is not a valid 18-char Salesforce id: its suffix should be "
                f"{expected!r} (got {value[15:]!r})"
            )
        return value[:15] + expected
    _check_15(value)
    return value + case_safe_suffix(value)


def to_15(value: str) -> str:
    """The case-sensitive 15-char form of a 15- or 18-char id."""
    return to_18(value)[:15]


def is_valid_id(value: object) -> bool:
    """Whether ``value`` is a well-formed 15-char id or an 18-char id with a correct suffix."""
    if not isinstance(value, str) or len(value) not in (15, 18):
        return False
    try:
        to_18(value)
    except ValueError:
        return False
    return True


def key_prefix(value: str) -> str:
    """The 3-char key prefix of an id (which object it belongs to)."""
    if not isinstance(value, str) or len(value) < 3:
        raise ValueError(f"a Salesforce id has at least a 3-char key prefix (got {value!r})")
    return value[:3]


def assign_key_prefixes(entities: Iterable[str]) -> dict[str, str]:
    """Key prefixes for ``entities``: the standard ones from :data:`KEY_PREFIXES`; any other
    custom object gets the next free ``a0X`` prefix in sorted name order (deterministic)."""
    names = sorted(set(entities))
    used = set(KEY_PREFIXES.values())
    out: dict[str, str] = {}
    for name in names:
        if name in KEY_PREFIXES:
            out[name] = KEY_PREFIXES[name]
    candidates = (f"a{a}{b}" for a in _BASE62[:10] for b in _BASE62[10:])
    for name in names:
        if name in out:
            continue
        prefix = next(c for c in candidates if c not in used)
        used.add(prefix)
        out[name] = prefix
    return out


def _base62(number: int, width: int) -> str:
    digits = []
    while number:
        number, rem = divmod(number, 62)
        digits.append(_BASE62[rem])
    return "".join(reversed(digits)).rjust(width, "0")


class IdFactory:
    """Mints unique 18-char ids for one org, deterministically from ``rng``.

    Each key prefix has its own counter that starts at a random offset and advances by small
    random steps, so ids look like a real org's (increasing, with gaps) and never repeat.
    ``pod`` is the 2-char instance part every id of the org shares.
    """

    def __init__(self, rng: random.Random, *, pod: str) -> None:
        if len(pod) != 2 or not _BASE62_SET.issuperset(pod):
            raise ValueError(f"pod must be 2 characters of [0-9A-Za-z] (got {pod!r})")
        self._random = rng.random
        self._rng = rng
        self._pod = pod
        self._next: dict[str, int] = {}

    @property
    def pod(self) -> str:
        return self._pod

    def new(self, prefix: str) -> str:
        """A fresh 18-char id with key prefix ``prefix``."""
        if len(prefix) != 3 or not _BASE62_SET.issuperset(prefix):
            raise ValueError(f"a key prefix is 3 characters of [0-9A-Za-z] (got {prefix!r})")
        current = self._next.get(prefix)
        if current is None:
            current = self._rng.randrange(62**4, 62**5)
        number = current + 1 + int(self._random() * 4)
        if number >= _NUMBER_SPACE:
            raise OverflowError(f"id space of key prefix {prefix} exhausted")
        self._next[prefix] = number
        id15 = f"{prefix}{self._pod}0{_base62(number, _NUMBER_WIDTH)}"
        return id15 + _suffix(id15)

    @staticmethod
    def org_id(rng: random.Random) -> str:
        """A random 18-char organization id (``00D``), whose pod the org's ids share."""
        pod = rng.choice("123456789") + rng.choice(_BASE62[10:])
        return to_18(f"00D{pod}0{_base62(rng.randrange(62**3, 62**4), _NUMBER_WIDTH)}")
