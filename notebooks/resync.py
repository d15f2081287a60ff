# Databricks notebook source
# MAGIC %md
# MAGIC # sfcdc: re-sync
# MAGIC
# MAGIC Runs `sfcdc resync`: re-reads through Salesforce's REST API the records (or whole
# MAGIC objects, after GAP_OVERFLOW or a replay gap) that the gold re-sync table lists as open,
# MAGIC and merges them into gold. Leave `object` blank for every object. Needs the sfcdc wheel
# MAGIC on the cluster (the `sfcdc_resync` job provides it). See `docs/operations.md`.
# MAGIC Secret references in `conf/pipeline.yml` are read from the environment (`{env: NAME}`)
# MAGIC and with this notebook's `dbutils` (`{secret: {scope, key}}`).

# COMMAND ----------

import os

from pipelines.cli import main
from pipelines.connect import secret_resolver

dbutils.widgets.text("object", "", "Object API name (blank: all)")
dbutils.widgets.text("conf_dir", "../conf", "conf/ directory")
dbutils.widgets.text("catalog", "main", "Catalog")
dbutils.widgets.text("bronze_schema", "sfcdc_bronze", "Bronze schema")
dbutils.widgets.text("silver_schema", "sfcdc_silver", "Silver schema")
dbutils.widgets.text("gold_schema", "sfcdc_gold", "Gold schema")
dbutils.widgets.text("source", "salesforce", "Source (salesforce or emulator)")

# COMMAND ----------

obj = dbutils.widgets.get("object").strip()
status = main(
    [
        "resync",
        *([obj] if obj else []),
        "--conf",
        dbutils.widgets.get("conf_dir"),
        "--set",
        "lake.engine=spark",
        "--set",
        f"lake.catalog={dbutils.widgets.get('catalog')}",
        "--set",
        f"lake.schemas.bronze={dbutils.widgets.get('bronze_schema')}",
        "--set",
        f"lake.schemas.silver={dbutils.widgets.get('silver_schema')}",
        "--set",
        f"lake.schemas.gold={dbutils.widgets.get('gold_schema')}",
        "--set",
        f"connection.source={dbutils.widgets.get('source')}",
    ],
    secrets=secret_resolver(environ=os.environ, dbutils=dbutils),
)
if status:
    raise RuntimeError(f"sfcdc resync stopped with status {status}: see its message above")
