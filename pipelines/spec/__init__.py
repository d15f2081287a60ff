"""The declarative configuration: ``conf/pipeline.yml`` and ``conf/objects/<name>.yml``.

:func:`load_conf` reads a ``conf/`` directory into frozen, typed models (one dataclass per
section), applies ``defaults`` to every object and derives what an object file leaves out (its
topic and table names). Every problem in every file is reported at once, in one
:class:`~ingest.errors.ConfigError` whose ``problems`` each name the file and the key path::

    conf/objects/account.yml: replay.start: must be one of 'earliest', 'latest' (got 'yesterday')

Secrets are never values in YAML: a secret key holds a reference, ``{env: NAME}`` or
``{secret: {scope: ..., key: ...}}`` (a Databricks secret scope). References are checked for
form here and resolved at connect time by the resolver the caller injects, so a missing
environment variable is not a load-time error.

The models double as the source of the published JSON Schema (``pipelines.spec.schema``): the
``doc`` and constraints in each field's metadata feed both the validation and the schema.

This package's ``__init__`` is its public face (tests import from it); the project's code in
``pipelines/``, ``benchmarks/`` and ``notebooks/`` imports from the module that defines a name:

- :mod:`pipelines.spec.models`: ``pipeline.yml`` and object-file models, :class:`TopicSpec`,
  and the rules for topic and table names;
- :mod:`pipelines.spec.sections`: the per-object sections ``defaults`` sets (replay,
  batching, silver, gold, health);
- :mod:`pipelines.spec.connection`: the ``connection`` section;
- :mod:`pipelines.spec.cometd`: object files of kind ``streaming_api`` (Streaming API
  channels);
- :mod:`pipelines.spec.conf`: :class:`Conf`, a loaded ``conf/`` directory;
- :mod:`pipelines.spec.load`: reading the YAML (the only module that parses it), ``--set``
  overrides and the checks across fields and files;
- :mod:`pipelines.spec.fields`: field metadata, validation and byte sizes;
- :mod:`pipelines.spec.schema`: the JSON Schema and key reference, generated from the models.

Imports inside the package go one way: fields <- sections, connection <- models <- cometd
<- conf <- load, and schema on top.
"""

from __future__ import annotations

from ingest.auth import EnvRef, ScopeRef, SecretRef
from pipelines.spec.conf import Conf
from pipelines.spec.connection import (
    API_VERSION_PATTERN,
    AuthSpec,
    ClientCredentialsAuth,
    ConnectionSpec,
    EmulatorMode,
    EmulatorSpec,
    EmulatorTls,
    EmulatorWorkload,
    JwtBearerAuth,
    RefreshTokenAuth,
    SalesforceSpec,
    SalesforceTls,
    SoapLoginAuth,
    Source,
    StaticTokenAuth,
    UsernamePasswordAuth,
    WorkloadTimestamps,
)
from pipelines.spec.fields import ByteSize, Credential, Duration, parse_byte_size, parse_duration
from pipelines.spec.load import (
    load_conf,
    load_object,
    load_pipeline,
    parse_override,
    pipeline_from_overrides,
)
from pipelines.spec.models import (
    IDENTIFIER_PATTERN,
    POLLED_PREFIX,
    TOPIC_FORMATS,
    TOPIC_PATTERN,
    CometdApiSpec,
    EngineName,
    IngestSpec,
    LakeSpec,
    Layer,
    MaintenanceSpec,
    ObjectKind,
    ObjectSpec,
    OpsSpec,
    PipelineSpec,
    PrometheusSpec,
    ReconcileSpec,
    RetrySpec,
    SchemasSpec,
    StorageSpec,
    TablesSpec,
    TopicInfo,
    TopicKind,
    TopicSpec,
    default_tables,
    default_topic,
    is_identifier,
    parse_topic,
    snake_case,
)
from pipelines.spec.sections import (
    DEFAULT_SEQUENCE_BY,
    BatchingSpec,
    CompoundFields,
    DefaultsSpec,
    DeleteMode,
    FormulasSpec,
    GoldSpec,
    HealthSpec,
    OnCorrupted,
    OnExpired,
    PollApi,
    PollSpec,
    ReplaySpec,
    ReplayStart,
    Scd2Spec,
    SilverSpec,
    parse_replay_id,
)

__all__ = [
    "API_VERSION_PATTERN",
    "DEFAULT_SEQUENCE_BY",
    "IDENTIFIER_PATTERN",
    "POLLED_PREFIX",
    "TOPIC_FORMATS",
    "TOPIC_PATTERN",
    "AuthSpec",
    "BatchingSpec",
    "ByteSize",
    "ClientCredentialsAuth",
    "CometdApiSpec",
    "CompoundFields",
    "Conf",
    "ConnectionSpec",
    "Credential",
    "DefaultsSpec",
    "DeleteMode",
    "Duration",
    "EmulatorMode",
    "EmulatorSpec",
    "EmulatorTls",
    "EmulatorWorkload",
    "EngineName",
    "EnvRef",
    "FormulasSpec",
    "GoldSpec",
    "HealthSpec",
    "IngestSpec",
    "JwtBearerAuth",
    "LakeSpec",
    "Layer",
    "MaintenanceSpec",
    "ObjectKind",
    "ObjectSpec",
    "OnCorrupted",
    "OnExpired",
    "OpsSpec",
    "PipelineSpec",
    "PollApi",
    "PollSpec",
    "PrometheusSpec",
    "ReconcileSpec",
    "RefreshTokenAuth",
    "ReplaySpec",
    "ReplayStart",
    "RetrySpec",
    "SalesforceSpec",
    "SalesforceTls",
    "Scd2Spec",
    "SchemasSpec",
    "ScopeRef",
    "SecretRef",
    "SilverSpec",
    "SoapLoginAuth",
    "Source",
    "StaticTokenAuth",
    "StorageSpec",
    "TablesSpec",
    "TopicInfo",
    "TopicKind",
    "TopicSpec",
    "UsernamePasswordAuth",
    "WorkloadTimestamps",
    "default_tables",
    "default_topic",
    "is_identifier",
    "load_conf",
    "load_object",
    "load_pipeline",
    "parse_byte_size",
    "parse_duration",
    "parse_override",
    "parse_replay_id",
    "parse_topic",
    "pipeline_from_overrides",
    "snake_case",
]
