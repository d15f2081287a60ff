"""The entry point of the Databricks jobs: the ``sfcdc`` command, failing the task on error.

``sfcdc`` returns its exit status, which a console script hands to ``sys.exit``. A Databricks
Python wheel task calls the entry point function itself and fails only when it raises, so a
command that stops on a configuration error would otherwise count as a successful run (and a
continuous job would not back off). ``sfcdc-job`` raises :class:`SystemExit` with the status
instead; the arguments are the same as ``sfcdc``'s.

Secret references ``{secret: {scope, key}}`` are read with ``dbutils.secrets.get``. A notebook
has ``dbutils`` as a global; a wheel task builds it from the cluster's Spark session
(``pyspark.dbutils.DBUtils``, which exists only on Databricks) or, on serverless compute, takes
the Databricks SDK's (``databricks.sdk.runtime.dbutils``). This entry point does that the
first time a scope is read, so a command that reads none never starts a session for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ingest.auth import Dbutils, DbutilsSecrets
from ingest.errors import ConfigError
from pipelines.cli import main as cli_main
from pipelines.connect import secret_resolver

__all__ = ["RuntimeDbutils", "main"]


class RuntimeDbutils:
    """The ``dbutils`` of the Databricks cluster this process runs on, obtained on first use
    from its Spark session."""

    def __init__(self) -> None:
        self._dbutils: Any = None

    @property
    def secrets(self) -> DbutilsSecrets:
        if self._dbutils is None:
            try:
                from pyspark.dbutils import DBUtils
            except ImportError:
                DBUtils = None
            if DBUtils is None:
                try:  # serverless compute: no cluster session to build it from
                    from databricks.sdk.runtime import dbutils as runtime_dbutils
                except ImportError:
                    runtime_dbutils = None
                if runtime_dbutils is not None:
                    self._dbutils = runtime_dbutils
                    return self._dbutils.secrets  # type: ignore[no-any-return]
                raise ConfigError(
                    "{secret: {scope, key}} references are read with Databricks' dbutils, "
                    "which exists only on a Databricks cluster (in a wheel task of sfcdc-job or "
                    "a notebook); elsewhere reference an environment variable with {env: NAME}"
                )
            from pyspark.sql import SparkSession

            self._dbutils = DBUtils(SparkSession.builder.getOrCreate())
        secrets: DbutilsSecrets = self._dbutils.secrets
        return secrets

    def __repr__(self) -> str:
        return f"RuntimeDbutils({'obtained' if self._dbutils is not None else 'not obtained'})"


def main(argv: Sequence[str] | None = None, *, dbutils: Dbutils | None = None) -> None:
    """Run ``sfcdc`` with ``argv`` (default: the process arguments); raise ``SystemExit`` with
    its status when it is not 0. Secret scopes are read with ``dbutils`` (default: the
    cluster's, see :class:`RuntimeDbutils`), environment variables from the environment."""
    secrets = secret_resolver(dbutils=dbutils if dbutils is not None else RuntimeDbutils())
    status = cli_main(argv, secrets=secrets)
    if status:
        raise SystemExit(status)
