# Databricks notebook source
# MAGIC %md
# MAGIC # sfcdc: onboard a new object
# MAGIC
# MAGIC Fetches the current event schema of a topic from the source `conf/pipeline.yml` connects
# MAGIC to (GetTopic, then GetSchema) and prints the object file for it. Commit the file to the
# MAGIC repository under `conf/objects/` and deploy the bundle again: files written here would be
# MAGIC replaced by the next `databricks bundle deploy`. Needs the sfcdc wheel on the cluster
# MAGIC (`databricks bundle run sfcdc_onboard --params topic=...` provides it).

# COMMAND ----------

import os
from pathlib import Path

from pipelines.connect import secret_resolver
from pipelines.onboard import fetch_schema, object_file_name, object_yaml
from pipelines.spec import load_conf, parse_override

dbutils.widgets.text("topic", "/data/CaseChangeEvent", "Topic of the object")
dbutils.widgets.text("channel", "", "Channel to put it on (optional)")
dbutils.widgets.text("conf_dir", "../conf", "conf/ directory")
dbutils.widgets.text("source", "salesforce", "Source (salesforce or emulator)")

# COMMAND ----------

conf = load_conf(
    Path(dbutils.widgets.get("conf_dir")),
    overrides=[parse_override(f"connection.source={dbutils.widgets.get('source')}")],
)
schema = fetch_schema(
    conf.pipeline.connection,
    dbutils.widgets.get("topic"),
    secrets=secret_resolver(environ=os.environ, dbutils=dbutils),
)

# COMMAND ----------

print(f"conf/objects/{object_file_name(schema)}:\n")
print(object_yaml(schema, topic=dbutils.widgets.get("channel") or None))
