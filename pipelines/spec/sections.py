"""The per-object sections of the configuration: ``replay``, ``batching``, ``silver``,
``gold`` (with its ``scd2``) and ``health``, which ``defaults`` in ``conf/pipeline.yml`` sets
for every object and each object file may override (:class:`DefaultsSpec`), and the object
file's own ``poll`` (objects read by incremental queries) and ``formulas``. Models only;
:mod:`pipelines.spec.load` reads the YAML into them, :mod:`pipelines.spec` re-exports them,
and ``pipelines.spec.schema`` publishes their JSON Schema.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Literal

from ingest.replay import After, Earliest, Latest, ReplayId, StartPosition
from pipelines.spec.fields import ByteSize, Duration, meta

__all__ = [
    "DEFAULT_SEQUENCE_BY",
    "BatchingSpec",
    "CompoundFields",
    "DefaultsSpec",
    "DeleteMode",
    "FormulasSpec",
    "GoldSpec",
    "HealthSpec",
    "OnCorrupted",
    "OnExpired",
    "PollApi",
    "PollSpec",
    "ReplaySpec",
    "ReplayStart",
    "Scd2Spec",
    "SilverSpec",
    "parse_replay_id",
]

ReplayStart = Literal["earliest", "latest"]
_HEX_RE = re.compile(r"[0-9A-Fa-f]+")
OnCorrupted = Literal["fail", "earliest", "latest"]
OnExpired = Literal["rebootstrap", "on_corrupted"]
CompoundFields = Literal["struct", "flattened"]
DeleteMode = Literal["soft", "hard"]
PollApi = Literal["rest", "bulk", "auto"]


@dataclass(frozen=True, kw_only=True)
class ReplaySpec:
    """Where a subscription starts when it has no checkpoint, and what a bad replay id does."""

    start: ReplayStart = field(
        default="earliest",
        metadata=meta(
            "Start of a new subscription: earliest (oldest retained event, 72 h on Salesforce) "
            "or latest (only new events). Ignored once a checkpoint exists."
        ),
    )
    on_corrupted: OnCorrupted = field(
        default="fail",
        metadata=meta(
            "When Salesforce rejects the stored replay id (expired or invalid): fail (stop and "
            "say so), or restart from earliest / latest (latest loses events)."
        ),
    )
    on_expired: OnExpired = field(
        default="on_corrupted",
        metadata=meta(
            "When Salesforce rejects the position sfcdc itself stored (an outage longer than "
            "the 72 h event retention): rebootstrap resumes at the newest event, records a "
            "replay gap and re-reads every record of the topic's objects (Bulk API for large "
            "ones) in `sfcdc run`, `sfcdc resync` or `sfcdc reconcile`, so gold ends equal to "
            "the org; on_corrupted applies on_corrupted as for any rejected replay id. New "
            "configurations set rebootstrap."
        ),
    )
    replay_id: str | None = field(
        default=None,
        metadata=meta(
            "Start a new subscription right after this replay id instead of at start (a "
            "replay id an earlier consumer stored): base64 as Salesforce's APIs show it, or "
            "hex; 'hex:' or 'base64:' in front says which when the text could be either (bare "
            "text of hex digits reads as hex). Ignored once a checkpoint exists.",
            max_length=200,
        ),
    )

    def corrupted_policy(self, *, stored: bool) -> OnCorrupted:
        """What a rejected replay id does: ``stored`` says the subscription resumes from a
        position sfcdc stored (a checkpoint), or started at earliest / latest, so a rejection
        means that position expired; a configured ``replay_id`` may simply be wrong."""
        if self.on_expired == "rebootstrap" and (stored or self.replay_id is None):
            return "latest"
        return self.on_corrupted

    def start_position(self) -> StartPosition:
        """Where a subscription without a checkpoint starts."""
        if self.replay_id is not None:
            return After(parse_replay_id(self.replay_id))
        return Earliest() if self.start == "earliest" else Latest()

    def _problems(self) -> list[tuple[str, str]]:
        if self.replay_id is None:
            return []
        try:
            parse_replay_id(self.replay_id)
        except ValueError as exc:
            return [("replay_id", str(exc))]
        return []


@dataclass(frozen=True, kw_only=True)
class BatchingSpec:
    """When a batch of received events is written to bronze (whichever limit comes first)."""

    max_events: int = field(default=50_000, metadata=meta("Events per bronze commit.", minimum=1))
    max_bytes: Annotated[int, ByteSize] = field(
        default=16 * 1024**2,
        metadata=meta(
            "Payload bytes per bronze commit: a byte count or a size such as '16MiB'. Landing "
            "holds about two batches while it writes (the open one and the one committing), and "
            "larger batches buy no throughput past a few MiB.",
            minimum=1024,
            maximum=1024**3,
        ),
    )
    max_age_seconds: float = field(
        default=5.0,
        metadata=meta(
            "Longest time an event waits in memory before its batch is written.",
            exclusive_minimum=0,
        ),
    )


@dataclass(frozen=True, kw_only=True)
class SilverSpec:
    """How an object's silver table is shaped."""

    compound_fields: CompoundFields = field(
        default="struct",
        metadata=meta(
            "Compound fields (Address, Location, PersonName): struct keeps one STRUCT column "
            "per field (BillingAddress.City), flattened makes one column per child "
            "(BillingAddress_City)."
        ),
    )
    max_rows_per_commit: int = field(
        default=1_000_000,
        metadata=meta(
            "Bronze rows decoded per silver commit: a larger backlog is processed in several "
            "commits, each recording the bronze version it reached (objects sharing a topic "
            "use the smallest of their values).",
            minimum=1000,
        ),
    )
    max_bytes_per_commit: Annotated[int, ByteSize] = field(
        default=512 * 1024**2,
        metadata=meta(
            "Bronze payload bytes decoded per silver commit, as landing recorded them: the "
            "bound that keeps wide objects' commits in memory (a byte count or a size such as "
            "'512MiB'; objects sharing a topic use the smallest).",
            minimum=1024**2,
        ),
    )


_COLUMN_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# The order of Salesforce's own replication guidance: commit time, then commit number, then
# the transaction and the change's place in it. Stream order is always added as the last
# tie-break.
DEFAULT_SEQUENCE_BY: tuple[str, ...] = (
    "_cdc_commit_timestamp",
    "_cdc_commit_number",
    "_cdc_transaction_key",
    "_cdc_sequence_number",
    "_cdc_bronze_batch_id",
    "_cdc_bronze_batch_seq",
)


@dataclass(frozen=True, kw_only=True)
class Scd2Spec:
    """SCD2 history of an object's gold table: one row per version of each record."""

    enabled: bool = field(
        default=False,
        metadata=meta("Keep a history table `<gold table>_history` with one row per version."),
    )
    track: tuple[str, ...] | Literal["all"] = field(
        default="all",
        metadata=meta(
            "Columns whose change starts a new version: a list of gold column names, or `all` "
            "(every body column).",
            pattern=_COLUMN_PATTERN,
        ),
    )


@dataclass(frozen=True, kw_only=True)
class GoldSpec:
    """How an object's gold table is folded and merged."""

    deletes: DeleteMode = field(
        default="soft",
        metadata=meta(
            "soft keeps a deleted record's row, with `_cdc_is_deleted` true and its values; "
            "hard removes the row and remembers the delete in `<gold table>_tombstones`."
        ),
    )
    sequence_by: tuple[str, ...] = field(
        default=DEFAULT_SEQUENCE_BY,
        metadata=meta(
            "Silver columns that order a record's changes; the bronze batch id and position "
            "are always added as the final tie-break. Changing it needs a rebuilt gold table.",
            pattern=_COLUMN_PATTERN,
        ),
    )
    scd2: Scd2Spec = field(default_factory=Scd2Spec, metadata=meta("SCD2 history table."))
    max_rows_per_commit: int = field(
        default=1_000_000,
        metadata=meta(
            "Silver rows folded per gold commit: a larger backlog is folded in several "
            "commits, each recording the silver version it reached, so a run's memory follows "
            "this value and not the backlog. A silver version is never split (a larger one is "
            "folded alone), so any value is safe; a small one only costs more commits.",
            minimum=1,
        ),
    )
    deletion_vectors: bool = field(
        default=False,
        metadata=meta(
            "Let a MERGE mark the gold (and SCD2 history) rows it replaces or removes as deleted "
            "(Delta deletion vectors) instead of rewriting the files that hold them, so a small "
            "batch into a large table writes little more than its own rows. The spark engine "
            "applies it (it upgrades the table's protocol to reader 3 / writer 7, which "
            "readers such as delta-rs cannot read); the local engine's writer cannot, and "
            "rewrites the files a MERGE touches."
        ),
    )


@dataclass(frozen=True, kw_only=True)
class PollSpec:
    """How an object without change events (``kind: polled``) is read: incremental queries on
    ``SystemModstamp`` (``queryAll``, so records in the Recycle Bin come back deleted)."""

    every: Annotated[float, Duration] = field(
        default=900.0,
        metadata=meta(
            "Poll this often (`sfcdc run --continuous`, `sfcdc poll` and the bundle's "
            "sfcdc_poll job poll an object once this much time has passed since its last "
            "poll; `sfcdc run --once` polls every polled object).",
            exclusive_minimum=0,
        ),
    )
    lookback: Annotated[float, Duration] = field(
        default=300.0,
        metadata=meta(
            "Each poll reads from the newest SystemModstamp the last poll saw minus this much: "
            "a transaction that committed late with an earlier SystemModstamp (in flight "
            "during the last poll), or a server whose clock lags, is still read. Records read "
            "twice change nothing in gold.",
            minimum=0,
        ),
    )
    api: PollApi = field(
        default="auto",
        metadata=meta(
            "REST query, a Bulk API 2.0 query job, or auto: count the records the poll would "
            "read first (one REST request) and use the Bulk API from bulk_threshold on."
        ),
    )
    bulk_threshold: int = field(
        default=50_000,
        metadata=meta("Records from which api auto reads with a Bulk API 2.0 job.", minimum=0),
    )


@dataclass(frozen=True, kw_only=True)
class FormulasSpec:
    """Formula fields, which change events never carry: refreshed in gold on a schedule."""

    refresh_every: Annotated[float, Duration] | None = field(
        default=None,
        metadata=meta(
            "Refresh the object's formula fields (its describe's calculated fields) this "
            "often: one Bulk API 2.0 query of Id and those fields updates only those gold "
            "columns and `_cdc_formulas_refreshed_at`. null: formula fields are not in gold.",
            exclusive_minimum=0,
        ),
    )
    api: PollApi = field(
        default="bulk",
        metadata=meta(
            "How the refresh reads: a Bulk API 2.0 query job (one job per refresh, whatever "
            "the object's size), REST query, or auto (count first, Bulk from 50,000 records)."
        ),
    )


@dataclass(frozen=True, kw_only=True)
class HealthSpec:
    """When `sfcdc status` calls an object WARN or FAIL (`sfcdc status --check` fails on FAIL).

    Lag is how far behind Salesforce the object's last table is: now minus the newest commit
    timestamp it has applied, or minus the last moment the stream showed nothing pending."""

    lag_warn_seconds: float = field(
        default=1800.0,
        metadata=meta("WARN when the object is this many seconds behind.", exclusive_minimum=0),
    )
    lag_fail_seconds: float = field(
        default=7200.0,
        metadata=meta(
            "FAIL when the object is this many seconds behind (at least lag_warn_seconds).",
            exclusive_minimum=0,
        ),
    )
    quarantine_warn_rows: int = field(
        default=1,
        metadata=meta(
            "WARN when the object's topic has this many quarantined rows (0: never).", minimum=0
        ),
    )
    resync_warn_records: int = field(
        default=1,
        metadata=meta(
            "WARN when this many records (or any whole-object re-sync) wait for `sfcdc resync` "
            "(0: never).",
            minimum=0,
        ),
    )

    def _problems(self) -> list[tuple[str, str]]:
        if self.lag_fail_seconds >= self.lag_warn_seconds:
            return []
        return [
            (
                "lag_fail_seconds",
                f"must be at least lag_warn_seconds ({self.lag_warn_seconds:g}) "
                f"(got {self.lag_fail_seconds:g})",
            )
        ]


@dataclass(frozen=True, kw_only=True)
class DefaultsSpec:
    """Settings applied to every object unless its own file overrides them."""

    replay: ReplaySpec = field(
        default_factory=ReplaySpec, metadata=meta("Replay start and recovery.")
    )
    batching: BatchingSpec = field(default_factory=BatchingSpec, metadata=meta("Bronze batching."))
    silver: SilverSpec = field(default_factory=SilverSpec, metadata=meta("Silver table shape."))
    gold: GoldSpec = field(default_factory=GoldSpec, metadata=meta("Gold fold and MERGE."))
    health: HealthSpec = field(
        default_factory=HealthSpec, metadata=meta("Lag and health thresholds of `sfcdc status`.")
    )


# ------------------------------------------------------------------------------ replay ids


def parse_replay_id(text: str) -> ReplayId:
    """A replay id written in YAML: ``hex:<digits>``, ``base64:<text>``, or bare text (hex
    when it is an even number of hex digits, base64 otherwise)."""
    value = text.strip()
    form, sep, rest = value.partition(":")
    if sep and form.lower() in ("hex", "base64"):
        value = rest.strip()
    else:
        form = "hex" if _HEX_RE.fullmatch(value) and len(value) % 2 == 0 else "base64"
    try:
        if form.lower() == "hex":
            return ReplayId.from_hex(value)
        return ReplayId.from_base64(value)
    except ValueError as exc:  # binascii.Error is a ValueError
        raise ValueError(
            f"must be a replay id in base64 (as Salesforce shows it, e.g. 'AAAAAAAABnc=') or "
            f"hex (e.g. '0000000000000677'), not empty (got {text!r})"
        ) from exc
