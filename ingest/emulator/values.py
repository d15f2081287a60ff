"""Realistic field values for the emulated org, drawn from one seeded ``random.Random``.

Values are in wire form (what the Avro body carries): dates as epoch ms at midnight UTC,
datetimes as epoch ms with whole seconds, times as ms since midnight, picklists as their API
value, multi-select picklists ``;``-joined in definition order. Texts mix ASCII with accented
and non-Latin letters, so anything hashing or measuring them must use UTF-8 and code points.

Long text comes in lines separated by the record's own line break (``\\r\\n`` for values typed
in a browser, ``\\n`` for API writes), never with leading or trailing whitespace (Salesforce
trims values), and with no stray line break of the other kind, so diffs are well defined.
"""

from __future__ import annotations

import random
import unicodedata
from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import Any, TypeVar

from ingest.emulator.textdiff import DIFF_MIN_LENGTH, Newline
from ingest.schema import FieldInfo

__all__ = ["DAY_MS", "PICKLISTS", "ValueFactory"]

DAY_MS = 86_400_000

_T = TypeVar("_T")

# API values of the picklists the shipped schemas use, keyed by (entity, field) or field alone.
PICKLISTS: MappingProxyType[str, tuple[str, ...]] = MappingProxyType(
    {
        "Account.Type": (
            "Prospect",
            "Customer - Direct",
            "Customer - Channel",
            "Channel Partner / Reseller",
            "Installation Partner",
            "Technology Partner",
            "Other",
        ),
        "Industry": (
            "Agriculture",
            "Apparel",
            "Banking",
            "Biotechnology",
            "Chemicals",
            "Communications",
            "Construction",
            "Consulting",
            "Education",
            "Electronics",
            "Energy",
            "Engineering",
            "Entertainment",
            "Finance",
            "Healthcare",
            "Insurance",
            "Manufacturing",
            "Media",
            "Retail",
            "Technology",
            "Transportation",
            "Utilities",
        ),
        "Ownership": ("Public", "Private", "Subsidiary", "Other"),
        "Rating": ("Hot", "Warm", "Cold"),
        "AccountSource": ("Web", "Phone Inquiry", "Partner Referral", "Purchased List", "Other"),
        "CleanStatus": (
            "Pending",
            "Matched",
            "Different",
            "NotFound",
            "Inactive",
            "SelectMatch",
            "Skipped",
        ),
        "CustomerPriority__c": ("High", "Medium", "Low"),
        "Segments__c": ("SMB", "Mid-Market", "Enterprise", "Public Sector", "Nonprofit"),
        "Tier__c": ("Bronze", "Silver", "Gold", "Platinum"),
        "LeadSource": (
            "Web",
            "Phone Inquiry",
            "Partner Referral",
            "Purchased List",
            "Trade Show",
            "Word of mouth",
            "Other",
        ),
        "Languages__c": (
            "English",
            "French",
            "German",
            "Spanish",
            "Portuguese",
            "Japanese",
            "Mandarin",
        ),
        "Level__c": ("Primary", "Secondary", "Tertiary"),
        "Opportunity.Type": (
            "Existing Customer - Upgrade",
            "Existing Customer - Replacement",
            "Existing Customer - Downgrade",
            "New Customer",
        ),
        "Competitors__c": ("Acme", "Globex", "Initech", "Umbrella", "Hooli", "Soylent"),
        "Status__c": ("Draft", "Sent", "Partially Paid", "Paid", "Overdue", "Void"),
        "Channels__c": ("Email", "Portal", "Post", "EDI"),
        "Carrier__c": ("DHL", "UPS", "FedEx", "La Poste", "Royal Mail", "Japan Post"),
        "GeocodeAccuracy": ("Address", "NearAddress", "Block", "Street", "ExtendedZip", "Zip"),
        "Salutation": ("Mr.", "Ms.", "Mrs.", "Dr.", "Prof.", "Mx."),
    }
)

# (City, State, StateCode, Country, CountryCode, postal code pattern, latitude, longitude)
_CITIES: tuple[tuple[str, str | None, str | None, str, str, str, float, float], ...] = (
    ("San Francisco", "California", "CA", "United States", "US", "941##", 37.7749, -122.4194),
    ("New York", "New York", "NY", "United States", "US", "100##", 40.7128, -74.0060),
    ("Austin", "Texas", "TX", "United States", "US", "787##", 30.2672, -97.7431),
    ("Chicago", "Illinois", "IL", "United States", "US", "606##", 41.8781, -87.6298),
    ("Toronto", "Ontario", "ON", "Canada", "CA", "M5V #A#", 43.6532, -79.3832),
    ("Montréal", "Quebec", "QC", "Canada", "CA", "H2X #B#", 45.5019, -73.5674),
    ("München", "Bavaria", "BY", "Germany", "DE", "80###", 48.1351, 11.5820),
    ("Zürich", "Zurich", "ZH", "Switzerland", "CH", "80##", 47.3769, 8.5417),
    ("São Paulo", "São Paulo", "SP", "Brazil", "BR", "01###-###", -23.5505, -46.6333),
    ("Paris", None, None, "France", "FR", "750##", 48.8566, 2.3522),
    ("London", None, None, "United Kingdom", "GB", "EC1A #BB", 51.5074, -0.1278),
    ("東京", "Tokyo", "13", "Japan", "JP", "100-####", 35.6762, 139.6503),
    ("Sydney", "New South Wales", "NSW", "Australia", "AU", "2###", -33.8688, 151.2093),
    ("Kraków", "Lesser Poland", None, "Poland", "PL", "3#-###", 50.0647, 19.9450),
)

_STREETS = (
    "Market St",
    "Main Street",
    "Harbour Road",
    "Rue de Rivoli",
    "Bahnhofstrasse",
    "Avenida Paulista",
    "King Street West",
    "Leopoldstraße",
    "Oak Avenue",
    "Mission Blvd",
    "Queen's Walk",
    "Via Roma",
)
_FIRST = (
    "Ana",
    "Marcus",
    "Priya",
    "Wei",
    "Amara",
    "Jonas",
    "Chloé",
    "Mateo",
    "Yuki",
    "Ingrid",
    "Omar",
    "Renée",
    "José",
    "Zoë",
    "Łukasz",
    "Søren",
    "Fatima",
    "Liam",
    "Noah",
    "Aiko",
    "Grace",
    "Dmitri",
    "Sofía",
    "Kwame",
)
_LAST = (
    "Müller",
    "García",
    "O'Brien",
    "Nguyen",
    "Kowalski",
    "Smith",
    "Johansson",
    "Dubois",
    "Rossi",
    "Tanaka",
    "Okafor",
    "Patel",
    "Schmidt",
    "Fernández",
    "Novák",
    "Ivanova",
    "Brown",
    "Haddad",
    "Larsen",
    "Costa",
    "Wójcik",
    "Kim",
    "Moreau",
    "Walker",
)
_MIDDLE = ("A.", "J.", "Marie", "Lee", "K.", "Elena")
_COMPANY_A = (
    "Blue",
    "Northern",
    "Bright",
    "Silver",
    "Grand",
    "Pacific",
    "Alpine",
    "Golden",
    "Urban",
    "Vertex",
    "Crimson",
    "Evergreen",
    "Nordic",
    "Lumière",
)
_COMPANY_B = (
    "Harbor",
    "Summit",
    "River",
    "Pine",
    "Falcon",
    "Orbit",
    "Cedar",
    "Beacon",
    "Atlas",
    "Meadow",
    "Quartz",
    "Willow",
)
_COMPANY_C = (
    "Logistics",
    "Foods",
    "Systems",
    "Energy",
    "Health",
    "Analytics",
    "Textiles",
    "Robotics",
    "Media",
    "Capital",
    "Labs",
    "Outfitters",
)
_COMPANY_SUFFIX = ("Inc.", "LLC", "GmbH", "Ltd", "S.A.", "AG", "Corp.", "K.K.", "")
_TITLES = (
    "CEO",
    "CFO",
    "VP Sales",
    "Head of Procurement",
    "Account Manager",
    "Buyer",
    "Operations Director",
    "IT Manager",
    "Data Engineer",
    "Directrice financière",
)
_DEPARTMENTS = ("Finance", "Sales", "Procurement", "IT", "Operations", "Legal", "Marketing")
_PRODUCTS = (
    "Renewal",
    "Expansion",
    "Pilot",
    "Platform Licence",
    "Support Upgrade",
    "Implementation",
    "Data Migration",
)
_NEXT_STEPS = (
    "Send proposal",
    "Schedule demo",
    "Legal review",
    "Call back Tuesday",
    "Negotiate discount",
    "Kick-off meeting",
    "Wait for PO",
)
_WORDS = (
    "account",
    "renewal",
    "pricing",
    "delivery",
    "warehouse",
    "contract",
    "customer",
    "meeting",
    "budget",
    "quarter",
    "shipment",
    "support",
    "integration",
    "forecast",
    "invoice",
    "discount",
    "partner",
    "region",
    "volume",
    "schedule",
    "feedback",
    "requirement",
    "approval",
    "migration",
    "timeline",
    "the",
    "a",
    "our",
    "their",
    "next",
    "new",
    "annual",
    "urgent",
    "confirmed",
    "pending",
    "reviewed",
    "with",
    "for",
    "after",
    "before",
    "and",
    "to",
    "of",
    "in",
    "on",
    "café",
    "naïve",
    "Größe",
    "façade",
    "déjà",
    "año",
    "smørrebrød",
    "données",
    "€",
    "—",
    "≥",
    "✓",
    "東京",
    "注文",
)


def _ascii_slug(text: str) -> str:
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return "".join(ch for ch in folded.lower() if ch.isalnum()) or "x"


_SLUGS = {w: _ascii_slug(w) for w in (*_FIRST, *_LAST, *_COMPANY_A, *_COMPANY_B)}


class ValueFactory:
    """Seeded generator of field values (see the module docstring for their forms)."""

    def __init__(self, rng: random.Random, *, start_ms: int) -> None:
        self._random = rng.random
        self._start_ms = start_ms
        self._start_day = start_ms // DAY_MS * DAY_MS
        # Pools of sentences, lines and phrases keep values cheap to build: a 1,000+ character
        # text would otherwise cost hundreds of random draws, and the generator must produce
        # tens of thousands of events per second.
        sentences = tuple(self._sentence() for _ in range(400))
        self._lines = tuple(self._line_from(sentences, html=False) for _ in range(800))
        self._html_lines = tuple(self._line_from(sentences, html=True) for _ in range(800))
        self._phrases = tuple(self._phrase() for _ in range(300))
        self._counters: dict[str, int] = {}

    # -- building blocks -------------------------------------------------------------------

    def pick(self, options: Sequence[_T]) -> _T:
        """One of ``options``, uniformly (one random draw)."""
        return options[int(self._random() * len(options))]

    def between(self, low: int, high: int) -> int:
        """An int in ``[low, high]``, uniformly (one random draw)."""
        return low + int(self._random() * (high - low + 1))

    def chance(self, p: float) -> bool:
        return self._random() < p

    def _sentence(self) -> str:
        words = [self.pick(_WORDS) for _ in range(self.between(5, 15))]
        words[0] = words[0][:1].upper() + words[0][1:]
        return " ".join(words) + self.pick((".", ".", ".", "!", "?"))

    def _phrase(self) -> str:
        return " ".join(self.pick(_WORDS) for _ in range(self.between(1, 3)))

    def _line_from(self, sentences: Sequence[str], *, html: bool) -> str:
        text = " ".join(self.pick(sentences) for _ in range(self.between(1, 3)))
        if not html:
            return text
        if self._random() < 0.2:
            return f"<p><b>{self.pick(_PRODUCTS)}</b>: {text}</p>"
        return f"<p>{text}</p>"

    def picklist(self, entity: str, name: str) -> tuple[str, ...]:
        """The API values of a picklist (a generic list for fields the catalogue lacks)."""
        options = PICKLISTS.get(f"{entity}.{name}") or PICKLISTS.get(name)
        if options is None:
            base = name.removesuffix("__c").replace("_", " ")
            options = tuple(f"{base} {letter}" for letter in "ABCDE")
        return options

    def company_name(self) -> str:
        parts = [self.pick(_COMPANY_A), self.pick(_COMPANY_B), self.pick(_COMPANY_C)]
        suffix = self.pick(_COMPANY_SUFFIX)
        if suffix:
            parts.append(suffix)
        if self._random() < 0.15:
            parts.insert(0, "The")
        return " ".join(parts)

    def person_name(self, children: Sequence[str]) -> dict[str, Any]:
        """A full name as the children of PersonName / Switchable_PersonName."""
        values: dict[str, Any] = dict.fromkeys(children)
        for child in children:
            if child == "FirstName":
                values[child] = self.pick(_FIRST)
            elif child == "LastName":
                values[child] = self.pick(_LAST)
            elif child == "Salutation" and self.chance(0.7):
                values[child] = self.pick(PICKLISTS["Salutation"])
            elif child == "MiddleName" and self.chance(0.2):
                values[child] = self.pick(_MIDDLE)
            elif child == "Suffix" and self.chance(0.05):
                values[child] = self.pick(("Jr.", "Sr.", "III", "PhD"))
            elif child == "InformalName" and self.chance(0.1):
                values[child] = self.pick(_FIRST)
        return values

    def name_part(self, child: str) -> str:
        """A new value for one child of a person name."""
        if child in {"FirstName", "InformalName"}:
            return str(self.pick(_FIRST))
        if child == "LastName":
            return str(self.pick(_LAST))
        if child == "Salutation":
            return str(self.pick(PICKLISTS["Salutation"]))
        if child == "MiddleName":
            return str(self.pick(_MIDDLE))
        return str(self.pick(("Jr.", "Sr.", "III", "PhD")))

    def address(self, children: Sequence[str]) -> dict[str, Any]:
        """A full Address (every child the schema has), in one of a few real cities."""
        random_ = self._random
        city, state, state_code, country, country_code, postal, lat, lon = self.pick(_CITIES)
        digits = str(int(random_() * 10**12)).zfill(12)
        postal_code = "".join(digits[i] if ch == "#" else ch for i, ch in enumerate(postal))
        street = f"{self.between(1, 2500)} {self.pick(_STREETS)}"
        if random_() < 0.1:
            # Street is a text area: a second line is common (suite, floor).
            street += f"\nSuite {self.between(100, 999)}"
        known = {
            "Street": street,
            "City": city,
            "State": state,
            "PostalCode": postal_code,
            "Country": country,
            "StateCode": state_code,
            "CountryCode": country_code,
            "Latitude": round(lat + (random_() - 0.5) / 10, 6),
            "Longitude": round(lon + (random_() - 0.5) / 10, 6),
            "GeocodeAccuracy": self.pick(PICKLISTS["GeocodeAccuracy"]),
        }
        return {c: known[c] if c in known else self.text_words() for c in children}

    def location(self, children: Sequence[str]) -> dict[str, Any]:
        _, _, _, _, _, _, lat, lon = self.pick(_CITIES)
        known = {
            "Latitude": round(lat + (self._random() - 0.5) * 0.4, 6),
            "Longitude": round(lon + (self._random() - 0.5) * 0.4, 6),
        }
        return {c: known.get(c) for c in children}

    def compound(self, info: FieldInfo) -> dict[str, Any]:
        """A full value for any compound field, chosen by the shape of its record."""
        children = [c.name for c in info.children]
        if "Street" in children or "City" in children:
            return self.address(children)
        if "LastName" in children:
            return self.person_name(children)
        if "Latitude" in children:
            return self.location(children)
        return {c.name: self.scalar("", c) for c in info.children}

    def text_words(self) -> str:
        """A short phrase of one to three words."""
        return str(self.pick(self._phrases))

    def long_text(self, *, newline: Newline, html: bool, long: bool) -> str:
        """A multi-line text; ``long`` makes it at least 1,000 characters (diff territory)."""
        random_ = self._random
        pool = self._html_lines if html else self._lines
        size = len(pool)
        lines: list[str] = []
        total = 0
        target = self.between(DIFF_MIN_LENGTH + 50, 2400) if long else self.between(20, 600)
        while total < target:
            line = pool[int(random_() * size)]
            lines.append(line)
            total += len(line) + len(newline)
            if not html and total < target and random_() < 0.1:
                lines.append("")
        return newline.join(lines)

    def _line(self, html: bool) -> str:
        return str(self.pick(self._html_lines if html else self._lines))

    def edit_long_text(self, value: str, *, newline: Newline, html: bool) -> str:
        """A small edit of ``value``: one or two lines changed, inserted or removed."""
        random_ = self._random
        lines = value.split(newline)
        for _ in range(self.pick((1, 1, 1, 2))):
            action = random_()
            index = int(random_() * len(lines))
            if action < 0.55 and lines[index]:
                lines[index] = self._line(html)
            elif action < 0.8 or len(lines) < 4:
                lines.insert(index, self._line(html))
            else:
                del lines[index]
        while lines and not lines[0]:
            lines.pop(0)
        while lines and not lines[-1]:
            lines.pop()
        edited = newline.join(lines)
        if edited == value:
            edited = newline.join([*lines, self._line(html)])
        return edited

    def grow_long_text(self, value: str, *, newline: Newline, html: bool) -> str:
        """A large addition (more than half the value again): never sent as a diff."""
        extra = self.long_text(newline=newline, html=html, long=True)
        while len(extra) <= len(value) // 2 + 1:
            extra = extra + newline + self._line(html)
        return value + newline + extra

    # -- scalar values ----------------------------------------------------------------------

    def date_ms(self, *, days_from: int, days_to: int) -> int:
        return self._start_day + self.between(days_from, days_to) * DAY_MS

    def datetime_ms(self, now_ms: int, *, max_days_back: int = 90) -> int:
        back = int(self._random() * max_days_back * 86_400)
        return max(0, now_ms - back * 1000) // 1000 * 1000

    def sequence(self, prefix: str, width: int = 6) -> str:
        number = self._counters.get(prefix, 0) + 1
        self._counters[prefix] = number
        return f"{prefix}{number:0{width}d}"

    def scalar(self, entity: str, info: FieldInfo, *, now_ms: int | None = None) -> Any:
        """A fresh non-null value for a scalar field (neither compound, lookup nor long text)."""
        return self.maker(entity, info)(self._start_ms if now_ms is None else now_ms)

    def maker(self, entity: str, info: FieldInfo) -> Callable[[int], Any]:
        """A function of the current time (epoch ms) that returns fresh values for a scalar
        field: resolved once per field, so generating a record does not re-dispatch."""
        name, kind, sf_type = info.name, info.kind, info.sf_type
        special = _SPECIAL.get(name)
        if special is not None:
            return lambda now: special(self)
        random_ = self._random
        between = self.between
        if kind == "boolean":
            return lambda now: random_() < 0.4
        if kind == "int":
            return lambda now: between(1, 500)
        if kind == "long":
            return lambda now: between(1, 10**6)
        if kind == "double":
            if sf_type == "Currency":
                return lambda now: between(10_000, 25_000_000) / 100
            if sf_type == "Percent":
                return lambda now: float(between(0, 100))
            return lambda now: between(0, 10_000_000) / 1000
        if kind == "date":
            return lambda now: self.date_ms(days_from=-700, days_to=700)
        if kind == "datetime":
            return self.datetime_ms
        if kind == "time":
            return lambda now: between(0, 95) * 15 * 60 * 1000
        if kind == "multi_picklist":
            options = self.picklist(entity, name)

            def multi(now: int) -> str:
                picked = [o for o in options if random_() < 0.35] or [self.pick(options)]
                return ";".join(picked)

            return multi
        if sf_type in {"DynamicEnum", "StaticEnum"}:
            options = self.picklist(entity, name)
            count = len(options)
            return lambda now: options[int(random_() * count)]
        if sf_type == "Email":
            return lambda now: _email(self)
        if sf_type in {"Phone", "Fax"}:
            return lambda now: _phone(self)
        if sf_type == "Url":
            return lambda now: _url(self)
        phrases = self._phrases
        size = len(phrases)
        return lambda now: phrases[int(random_() * size)]


def _email(v: ValueFactory) -> str:
    first, last, host = _SLUGS[v.pick(_FIRST)], _SLUGS[v.pick(_LAST)], _SLUGS[v.pick(_COMPANY_B)]
    return f"{first}.{last}@{host}.example.com"


def _url(v: ValueFactory) -> str:
    return f"https://www.{_SLUGS[v.pick(_COMPANY_A)]}-{_SLUGS[v.pick(_COMPANY_B)]}.example.com"


def _phone(v: ValueFactory) -> str:
    country = v.pick(("1", "44", "49", "33", "81"))
    return f"+{country} {v.between(20, 989)} {v.between(100, 999)} {v.between(1000, 9999)}"


_SPECIAL: dict[str, Any] = {
    "Phone": _phone,
    "MobilePhone": _phone,
    "Fax": _phone,
    "AccountNumber": lambda v: f"CD{v.between(100000, 999999)}",
    "YearStarted": lambda v: str(v.between(1890, 2023)),
    "AnnualRevenue": lambda v: float(v.between(1, 5000) * 100_000),
    "NumberOfEmployees": lambda v: v.pick((5, 12, 40, 150, 800, 2500, 12000, 90000)),
    "Legacy_Code__c": lambda v: f"LC-{v.between(0, 36**5):07d}",
    "Title": lambda v: v.pick(_TITLES),
    "Department": lambda v: v.pick(_DEPARTMENTS),
    "NextStep": lambda v: v.pick(_NEXT_STEPS),
    "Amount": lambda v: v.between(100_000, 50_000_000) / 100,
    "Amount__c": lambda v: v.between(5_000, 8_000_000) / 100,
    "Discount__c": lambda v: round(v.between(0, 300) / 10, 1),
    "Tax_Rate__c": lambda v: v.pick((0.0, 5.5, 7.7, 10.0, 19.0, 20.0, 21.0)),
    "Quantity__c": lambda v: v.between(100, 50_000) / 100,
    "Weight_Kg__c": lambda v: v.between(200, 40_000) / 1000,
    "Line_Count__c": lambda v: v.between(1, 40),
    "Birthdate": lambda v: v.date_ms(days_from=-27_000, days_to=-6_600),
    "PersonBirthdate": lambda v: v.date_ms(days_from=-27_000, days_to=-6_600),
    "CloseDate": lambda v: v.date_ms(days_from=-120, days_to=400),
    "SLAExpirationDate__c": lambda v: v.date_ms(days_from=0, days_to=900),
    "Issue_Date__c": lambda v: v.date_ms(days_from=-60, days_to=30),
    "Due_Date__c": lambda v: v.date_ms(days_from=0, days_to=90),
    "Delivery_Date__c": lambda v: v.date_ms(days_from=0, days_to=20),
    "Reference__c": lambda v: f"REF-{v.between(0, 99_999_999):08d}",
    "Order_Number__c": lambda v: v.sequence("ORD-", 7),
    "Billing_Email__c": lambda v: f"billing@{_SLUGS[v.pick(_COMPANY_B)]}.example.com",
    "Portal_Url__c": lambda v: f"https://portal.example.com/invoices/{v.between(10**5, 10**6)}",
    "Website": _url,
}
