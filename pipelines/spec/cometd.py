"""Object files of the Streaming API source (``kind: streaming_api``): the models, what they
derive, and the checks that span files.

An object file whose ``kind`` is ``streaming_api`` subscribes to one Streaming API (CometD)
channel instead of a Pub/Sub topic::

    # yaml-language-server: $schema=../schema/streaming_api.schema.json
    kind: streaming_api
    channel: /topic/InvoiceUpdates
    pushtopic:
      manage: create_or_update
      query: SELECT Id, Name, Amount__c, Status__c FROM Invoice__c
      notify_for_fields: Referenced
    gold:
      deletes: soft

:mod:`pipelines.spec.load` parses the files (YAML is read there only) into
:class:`CometdObjectSpec` and keeps them in ``Conf.streams``, apart from the Pub/Sub objects:
the two sources land into tables of their own. The channel decides the rest:

========================  ============  ===========================================  ========
channel                   kind          silver                                       gold
========================  ============  ===========================================  ========
``/topic/<PushTopic>``    pushtopic     the query's fields, typed from the describe  yes
``/data/<X>ChangeEvent``  change_event  the change event's fields and header          yes
``/event/<Name>__e``      platform_event  the event's fields                         no
``/u/<name>``             generic       the payload as text, with its metadata       no
========================  ============  ===========================================  ========
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pipelines.spec.fields import Problems, meta
from pipelines.spec.models import LakeSpec, Layer, ObjectSpec, snake_case
from pipelines.spec.sections import BatchingSpec, DeleteMode, ReplaySpec, Scd2Spec, SilverSpec

__all__ = [
    "CHANNEL_FORMATS",
    "CHANNEL_PATTERN",
    "STREAM_KEY_PREFIX",
    "ChannelKind",
    "CometdGoldSpec",
    "CometdObjectSpec",
    "CometdTablesSpec",
    "NotifyForFields",
    "PushTopicManage",
    "PushTopicSpec",
    "channel_kind",
    "check_streams",
    "query_parts",
]

ChannelKind = Literal["pushtopic", "generic", "platform_event", "change_event"]
PushTopicManage = Literal["create_or_update", "existing"]
NotifyForFields = Literal["All", "Referenced", "Select", "Where"]

# Checkpoint rows, app transactions and re-sync rows of a Streaming API channel are keyed by
# this prefix and the channel, so a channel never shares them with a Pub/Sub topic of the same
# name (/event/Order_Shipped__e exists on both APIs).
STREAM_KEY_PREFIX = "streaming:"

_NAME = r"[A-Za-z][A-Za-z0-9_]*"
CHANNEL_FORMATS: tuple[str, ...] = (
    "/topic/<PushTopic name>",
    "/u/<StreamingChannel name>",
    "/event/<Name>__e",
    "/data/<Object>ChangeEvent",
    "/data/<Object>__ChangeEvent",
)
_CHANNEL_RULES: tuple[tuple[re.Pattern[str], ChannelKind], ...] = (
    (re.compile(r"^/topic/[A-Za-z0-9_]{1,25}$"), "pushtopic"),
    (re.compile(rf"^/u/{_NAME}$"), "generic"),
    (re.compile(rf"^/event/{_NAME}$"), "platform_event"),
    (re.compile(rf"^/data/{_NAME}ChangeEvent$"), "change_event"),
)
CHANNEL_PATTERN = "^(" + "|".join(r.pattern[1:-1] for r, _ in _CHANNEL_RULES) + ")$"
_CHANNEL_HINT = f"a Streaming API channel, one of {', '.join(CHANNEL_FORMATS)}"
_OBJECT_PATTERN = r"^[A-Za-z][A-Za-z0-9_]*$"
_API_VERSION = r"^[0-9]{2,3}\.0$"
_IDENT = r"^[A-Za-z_][A-Za-z0-9_]*$"
_IDENT_HINT = "a SQL identifier: letters, digits and '_', not starting with a digit"
_DERIVED: Any = None
_LAYERS: tuple[Layer, ...] = ("bronze", "silver", "gold")
# sfcdc's own tables, whatever the layer.
_RESERVED = frozenset(
    {"sfcdc_checkpoints", "sfcdc_schemas", "sfcdc_describes", "sfcdc_quarantine", "sfcdc_resync"}
)

# SELECT <fields> FROM <Object> [WHERE ...]: the parts sfcdc needs from a PushTopic query (the
# server validates the rest when the PushTopic is saved).
_QUERY = re.compile(
    r"^\s*SELECT\s+(?P<fields>.+?)\s+FROM\s+(?P<entity>[A-Za-z][A-Za-z0-9_]*)"
    r"(?:\s+WHERE\s+.+)?\s*$",
    re.IGNORECASE | re.DOTALL,
)
_FIELD = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_REFUSED = re.compile(r"\b(LIMIT|ORDER\s+BY|GROUP\s+BY|OFFSET|TYPEOF|COUNT)\b", re.IGNORECASE)


def channel_kind(channel: str) -> ChannelKind:
    """The kind of a Streaming API channel; ``ValueError`` lists the formats otherwise."""
    for pattern, kind in _CHANNEL_RULES:
        if isinstance(channel, str) and pattern.fullmatch(channel):
            return kind
    raise ValueError(f"must be {_CHANNEL_HINT} (got {channel!r})")


def query_parts(query: str) -> tuple[tuple[str, ...], str]:
    """``(selected fields, object)`` of a PushTopic query. ``ValueError`` says what is wrong
    with a query sfcdc cannot land (the org checks the rest when the PushTopic is saved)."""
    # Checked first: the query shape below does not admit these clauses, and saying which
    # clause is refused helps more than saying the shape is wrong.
    if _REFUSED.search(query):
        raise ValueError(
            "PushTopic queries cannot use LIMIT, ORDER BY, GROUP BY, OFFSET, TYPEOF or "
            f"aggregates (got {query!r})"
        )
    match = _QUERY.match(query)
    if match is None:
        raise ValueError(
            f"must be SELECT Id, <fields> FROM <Object> [WHERE <condition>] (got {query!r})"
        )
    names = [n.strip() for n in match.group("fields").split(",")]
    bad = [n for n in names if not _FIELD.fullmatch(n)]
    if bad:
        raise ValueError(
            f"selects {bad}: a PushTopic query selects plain fields of its object (no "
            "relationship fields such as Account.Name, no functions)"
        )
    if "id" not in {n.lower() for n in names}:
        raise ValueError(f"must select Id (got SELECT {', '.join(names)})")
    seen: dict[str, str] = {}
    for n in names:
        if n.lower() in seen:
            raise ValueError(f"selects {n} twice")
        seen[n.lower()] = n
    return tuple(n for n in names if n.lower() != "id"), match.group("entity")


# --------------------------------------------------------------------------------- models


@dataclass(frozen=True, kw_only=True)
class PushTopicSpec:
    """The PushTopic record behind a ``/topic/<Name>`` channel (its ``Name`` is the channel's
    last segment)."""

    manage: PushTopicManage = field(
        metadata=meta(
            "create_or_update: before subscribing, sfcdc creates the PushTopic or updates its "
            "query and settings to match this file (idempotent: an equal PushTopic is left as "
            "it is). existing: the PushTopic is managed elsewhere; sfcdc only reads it, checks "
            "that the settings given here match it, and fails if it does not exist."
        )
    )
    query: str | None = field(
        default=None,
        metadata=meta(
            "The SOQL query: SELECT Id, <fields> FROM <Object> [WHERE <condition>]. Required "
            "with create_or_update; with existing, left out to take the org's query as it is.",
            max_length=1300,
        ),
    )
    api_version: str = field(
        default="62.0",
        metadata=meta(
            "ApiVersion of the PushTopic (the fields and rules of that version apply).",
            pattern=_API_VERSION,
            hint="a version such as '62.0'",
        ),
    )
    notify_for_fields: NotifyForFields | None = field(
        default=None,
        metadata=meta(
            "NotifyForFields: which changed fields make an update notify (All, Referenced, "
            "Select, Where). null: Referenced when sfcdc creates it, not checked with existing."
        ),
    )
    notify_for_operation_create: bool | None = field(
        default=None,
        metadata=meta(
            "NotifyForOperationCreate. null: true when sfcdc creates it, not checked with existing."
        ),
    )
    notify_for_operation_update: bool | None = field(
        default=None,
        metadata=meta(
            "NotifyForOperationUpdate. null: true when sfcdc creates it, not checked with existing."
        ),
    )
    notify_for_operation_delete: bool | None = field(
        default=None,
        metadata=meta(
            "NotifyForOperationDelete. null: true when sfcdc creates it, not checked with existing."
        ),
    )
    notify_for_operation_undelete: bool | None = field(
        default=None,
        metadata=meta(
            "NotifyForOperationUndelete. null: true when sfcdc creates it, not checked with "
            "existing."
        ),
    )
    description: str | None = field(
        default=None, metadata=meta("Description of the PushTopic.", max_length=400)
    )

    def _problems(self) -> list[tuple[str, str]]:
        if self.query is None:
            if self.manage == "create_or_update":
                return [("query", "required with manage: create_or_update (the PushTopic's SOQL)")]
            return []
        try:
            query_parts(self.query)
        except ValueError as exc:
            return [("query", str(exc))]
        return []

    def settings(self) -> dict[str, Any]:
        """The PushTopic fields this file states, as the REST API names them (``Query``,
        ``ApiVersion``, ``NotifyForFields``, ...); settings left null are left out."""
        values: dict[str, Any] = {
            "Query": self.query,
            "ApiVersion": float(self.api_version),
            "NotifyForFields": self.notify_for_fields,
            "NotifyForOperationCreate": self.notify_for_operation_create,
            "NotifyForOperationUpdate": self.notify_for_operation_update,
            "NotifyForOperationDelete": self.notify_for_operation_delete,
            "NotifyForOperationUndelete": self.notify_for_operation_undelete,
            "Description": self.description,
        }
        return {k: v for k, v in values.items() if v is not None}


@dataclass(frozen=True, kw_only=True)
class CometdGoldSpec:
    """How a Streaming API object's gold table is merged (PushTopic and change event
    channels). Records are ordered by replay id on a PushTopic channel and by the change
    event header (commit time and number) on a change event channel."""

    deletes: DeleteMode = field(
        default="soft",
        metadata=meta(
            "soft keeps a deleted record's row, with `_cdc_is_deleted` true and its values; "
            "hard removes the row and remembers the delete in `<gold table>_tombstones`."
        ),
    )
    scd2: Scd2Spec = field(default_factory=Scd2Spec, metadata=meta("SCD2 history table."))
    max_rows_per_commit: int = field(
        default=1_000_000,
        metadata=meta(
            "Silver rows folded per gold commit (as `gold.max_rows_per_commit` of an object).",
            minimum=1,
        ),
    )


@dataclass(frozen=True, kw_only=True)
class CometdTablesSpec:
    """Table names of one Streaming API object; each defaults to a name derived from the
    channel."""

    bronze: str = field(
        default=_DERIVED,
        metadata=meta(
            "Bronze table of the channel (raw JSON messages).",
            pattern=_IDENT,
            hint=_IDENT_HINT,
            max_length=255,
            derived="streaming_ and the snake_case of the channel's last segment: "
            "streaming_invoice_updates",
        ),
    )
    silver: str = field(
        default=_DERIVED,
        metadata=meta(
            "Silver table.",
            pattern=_IDENT,
            hint=_IDENT_HINT,
            max_length=255,
            derived="snake_case of the channel's last segment without __e or ChangeEvent: "
            "invoice_updates, order_shipped, account",
        ),
    )
    gold: str = field(
        default=_DERIVED,
        metadata=meta(
            "Gold table (PushTopic and change event channels).",
            pattern=_IDENT,
            hint=_IDENT_HINT,
            max_length=255,
            derived="as silver",
        ),
    )

    def for_layer(self, layer: Layer) -> str:
        name: str = getattr(self, layer)
        return name


def _base_name(channel: str) -> str:
    last = channel.rsplit("/", 1)[-1]
    for suffix in ("__ChangeEvent", "ChangeEvent", "__e"):
        if last.endswith(suffix) and last != suffix:
            last = last.removesuffix(suffix)
            break
    return snake_case(last)


def _derived_object(channel: str, kind: ChannelKind, pushtopic: PushTopicSpec | None) -> str | None:
    last = channel.rsplit("/", 1)[-1]
    if kind == "pushtopic":
        if pushtopic is not None and pushtopic.query is not None:
            try:
                return query_parts(pushtopic.query)[1]
            except ValueError:
                return None
        return None
    if kind == "platform_event":
        return last
    if kind == "change_event":
        if last.endswith("__ChangeEvent"):
            return last.removesuffix("__ChangeEvent") + "__c"
        return last.removesuffix("ChangeEvent")
    return None


@dataclass(frozen=True, kw_only=True)
class CometdObjectSpec:
    """``conf/objects/<name>.yml`` with ``kind: streaming_api``: one Streaming API (CometD)
    channel landed exactly once, decoded into silver and, for PushTopic and change event
    channels, merged into a current-state gold table."""

    kind: Literal["streaming_api"] = field(
        metadata=meta("streaming_api: this file subscribes to a Streaming API channel.")
    )
    channel: str = field(
        metadata=meta(
            "The channel: /topic/<PushTopic> (PushTopic notifications), /u/<name> (generic "
            "events), /event/<Name>__e (platform events), /data/<Object>ChangeEvent (change "
            "events as JSON).",
            pattern=CHANNEL_PATTERN,
            hint=_CHANNEL_HINT,
        )
    )
    api_name: str | None = field(
        default=_DERIVED,
        metadata=meta(
            "The object the channel carries, whose describe types the silver columns. "
            "Required for a PushTopic used as it exists without a query here; none for a "
            "generic channel.",
            key="object",
            pattern=_OBJECT_PATTERN,
            hint="a Salesforce API name such as 'Invoice__c'",
            max_length=255,
            derived="the query's FROM object, the event of /event/..., the object of "
            "/data/<Object>ChangeEvent",
        ),
    )
    pushtopic: PushTopicSpec | None = field(
        default=None,
        metadata=meta(
            "The PushTopic behind a /topic/ channel (required there, refused on other channels)."
        ),
    )
    enabled: bool = field(
        default=True, metadata=meta("Land this channel; false keeps the file but skips it.")
    )
    replay: ReplaySpec = field(
        default_factory=ReplaySpec,
        metadata=meta(
            "Overrides of defaults.replay: start earliest subscribes with -2 (every retained "
            "notification: 24 h for PushTopic and generic channels, 72 h for platform and "
            "change events), latest with -1 (new ones only); on_corrupted decides what a "
            "rejected stored replay id does.",
            inherits="defaults.replay",
        ),
    )
    batching: BatchingSpec = field(
        default_factory=BatchingSpec,
        metadata=meta(
            "Overrides of defaults.batching (max_bytes counts the raw JSON).",
            inherits="defaults.batching",
        ),
    )
    silver: SilverSpec = field(
        default_factory=SilverSpec,
        metadata=meta("Overrides of defaults.silver.", inherits="defaults.silver"),
    )
    gold: CometdGoldSpec = field(
        default_factory=CometdGoldSpec,
        metadata=meta(
            "Overrides of defaults.gold (deletes, scd2, max_rows_per_commit).",
            inherits="defaults.gold",
        ),
    )
    tables: CometdTablesSpec = field(
        default_factory=CometdTablesSpec, metadata=meta("Table names.")
    )

    def __post_init__(self) -> None:
        try:
            kind = channel_kind(self.channel)
        except ValueError:
            return  # parse_model reports the channel; nothing can be derived from it
        api_name = self.api_name
        if api_name is None:
            api_name = _derived_object(self.channel, kind, self.pushtopic)
        base = _base_name(self.channel)
        last = self.channel.rsplit("/", 1)[-1]
        t = self.tables
        tables = CometdTablesSpec(
            bronze=t.bronze if t.bronze is not None else f"streaming_{snake_case(last)}",
            silver=t.silver if t.silver is not None else base,
            gold=t.gold if t.gold is not None else base,
        )
        object.__setattr__(self, "api_name", api_name)
        object.__setattr__(self, "tables", tables)

    @property
    def channel_kind(self) -> ChannelKind:
        return channel_kind(self.channel)

    @property
    def key(self) -> str:
        """``streaming:<channel>``: the channel's name in checkpoint rows, Delta app
        transactions, the quarantine and the re-sync table."""
        return f"{STREAM_KEY_PREFIX}{self.channel}"

    @property
    def has_gold(self) -> bool:
        """PushTopic and change event channels carry records; the others carry events."""
        return self.channel_kind in ("pushtopic", "change_event")

    @property
    def push_topic_name(self) -> str | None:
        return self.channel.removeprefix("/topic/") if self.channel_kind == "pushtopic" else None

    def selected_fields(self) -> tuple[str, ...] | None:
        """The fields the PushTopic query selects besides ``Id`` (``None``: no query here)."""
        if self.pushtopic is None or self.pushtopic.query is None:
            return None
        return query_parts(self.pushtopic.query)[0]

    def _problems(self) -> list[tuple[str, str]]:
        try:
            kind = channel_kind(self.channel)
        except ValueError as exc:
            return [("channel", str(exc))]
        problems: list[tuple[str, str]] = []
        if kind == "pushtopic" and self.pushtopic is None:
            problems.append(
                (
                    "pushtopic",
                    "required for a /topic/ channel: say whether sfcdc manages the PushTopic "
                    "(pushtopic: {manage: create_or_update, query: SELECT ...}) or uses an "
                    "existing one (pushtopic: {manage: existing})",
                )
            )
        if kind != "pushtopic" and self.pushtopic is not None:
            problems.append(
                (
                    "pushtopic",
                    f"only a /topic/ channel has a PushTopic (got channel {self.channel!r}); "
                    "remove the section",
                )
            )
        if kind == "generic" and self.api_name is not None:
            problems.append(
                (
                    "object",
                    "a generic channel (/u/...) carries text payloads, not an object's records; "
                    f"remove the key (got {self.api_name!r})",
                )
            )
        if kind == "pushtopic" and self.pushtopic is not None and self.pushtopic.query:
            derived = _derived_object(self.channel, kind, self.pushtopic)
            if derived is not None and self.api_name != derived:
                problems.append(
                    (
                        "object",
                        f"the query selects FROM {derived}; object must be {derived!r} or left "
                        f"out (got {self.api_name!r})",
                    )
                )
        if (
            kind == "pushtopic"
            and self.api_name is None
            and self.pushtopic is not None
            and self.pushtopic.query is None
        ):
            # Without a PushTopic section, or with a query that is wrong, that problem is
            # reported instead: the object follows once it is fixed.
            problems.append(
                (
                    "object",
                    "required when pushtopic.query is left out: the object whose describe types "
                    "the silver columns",
                )
            )
        if kind in ("platform_event", "change_event"):
            derived = _derived_object(self.channel, kind, None)
            if self.api_name != derived:
                problems.append(
                    (
                        "object",
                        f"{self.channel} carries {derived}; object must be {derived!r} or left "
                        f"out (got {self.api_name!r})",
                    )
                )
        return problems


# -------------------------------------------------------------------------------- checks


def check_streams(
    streams: Sequence[tuple[CometdObjectSpec, Problems]],
    objects: Sequence[tuple[ObjectSpec, Problems]],
    lake: LakeSpec,
) -> None:
    """Problems spanning files: a channel landed by two files, channels that disagree on
    ``replay.on_corrupted`` (one CometD session carries them all), and table names taken twice
    (by two channels, or by a channel and a Pub/Sub object)."""
    by_channel: dict[str, str] = {}
    policy: tuple[str, str] | None = None
    for spec, ctx in streams:
        first = by_channel.setdefault(spec.channel, ctx.file)
        if first != ctx.file:
            ctx.add("channel", f"{spec.channel} is already landed by {first}")
        if not spec.enabled:
            continue
        if policy is None:
            policy = (spec.replay.on_corrupted, ctx.file)
        elif policy[0] != spec.replay.on_corrupted:
            ctx.add(
                "replay.on_corrupted",
                "the Streaming API channels share one CometD session, whose rejected replay ids "
                f"are handled alike: must equal that of {policy[1]} ({policy[0]!r}; got "
                f"{spec.replay.on_corrupted!r})",
            )
    owners: dict[tuple[str, str], str] = {}
    for obj, ctx in objects:
        for layer in _LAYERS:
            name = lake.table_name(obj.tables.for_layer(layer))
            owners.setdefault((lake.schemas.for_layer(layer), name), ctx.file)
    for spec, ctx in streams:
        layers = _LAYERS if spec.has_gold else _LAYERS[:2]
        for layer in layers:
            schema = lake.schemas.for_layer(layer)
            name = lake.table_name(spec.tables.for_layer(layer))
            if len(name) > 255:
                ctx.add(
                    f"tables.{layer}",
                    f"with lake.table_prefix the name must be at most 255 characters (got "
                    f"{len(name)})",
                )
                continue
            if name in _RESERVED:
                ctx.add(f"tables.{layer}", f"{name!r} is reserved for sfcdc's own tables")
                continue
            owner = owners.setdefault((schema, name), ctx.file)
            if owner != ctx.file:
                ctx.add(
                    f"tables.{layer}",
                    f"table {schema}.{name} is already used by {owner}; set tables.{layer} "
                    "to another name",
                )
