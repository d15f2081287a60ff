# Databricks notebook source
# MAGIC %md
# MAGIC # sfcdc: onboard a new object
# MAGIC
# MAGIC Fetches the current event schema of a topic from the source `conf/pipeline.yml` connects
# MAGIC to (GetTopic, then GetSchema) and prints the object file for it; given an object's API
# MAGIC name instead, proposes `kind: change_events` where the org has change events for it and
# MAGIC `kind: polled` (from its describe) where it does not. Commit the file to the
# MAGIC repository under `conf/objects/` and deploy the bundle again: files written here would be
# MAGIC replaced by the next `databricks bundle deploy`. Needs the sfcdc wheel on the cluster
# MAGIC (`databricks bundle run sfcdc_onboard --params topic=...` provides it).

# COMMAND ----------

import os
from pathlib import Path

from pipelines.connect import secret_resolver
from pipelines.onboard import fetch_schema, object_file_name, object_yaml, propose
from pipelines.spec.load import load_conf, parse_override

dbutils.widgets.text("topic", "/data/CaseChangeEvent", "Topic or API name of the object")
dbutils.widgets.text("channel", "", "Channel to put it on (optional)")
dbutils.widgets.text("conf_dir", "../conf", "conf/ directory")
dbutils.widgets.text("source", "salesforce", "Source (salesforce or emulator)")

# COMMAND ----------

conf = load_conf(
    Path(dbutils.widgets.get("conf_dir")),
    overrides=[parse_override(f"connection.source={dbutils.widgets.get('source')}")],
)
secrets = secret_resolver(environ=os.environ, dbutils=dbutils)
topic = dbutils.widgets.get("topic")
if topic.startswith("/"):
    schema = fetch_schema(conf.pipeline.connection, topic, secrets=secrets)
    name, text = (
        object_file_name(schema),
        object_yaml(schema, topic=dbutils.widgets.get("channel") or None),
    )
else:
    # An object's API name: change events where the org has them for it, polls elsewhere.
    name, text = propose(conf, topic, secrets=secrets)

# COMMAND ----------

print(f"conf/objects/{name}:\n")
print(text)
