# Databricks notebook source
# MAGIC %md
# MAGIC # sfcdc: explore bronze, silver and gold
# MAGIC
# MAGIC Read-only queries over the tables the sfcdc jobs write. Set the catalog and the three
# MAGIC schemas to the bundle target's values (`databricks.yml`: `catalog`, `bronze_schema`,
# MAGIC `silver_schema`, `gold_schema`) and pick an object's table. Column meanings:
# MAGIC `docs/querying.md`.

# COMMAND ----------

dbutils.widgets.text("catalog", "main", "Catalog")
dbutils.widgets.text("bronze_schema", "sfcdc_bronze", "Bronze schema")
dbutils.widgets.text("silver_schema", "sfcdc_silver", "Silver schema")
dbutils.widgets.text("gold_schema", "sfcdc_gold", "Gold schema")
dbutils.widgets.text("table", "account", "Silver / gold table")
dbutils.widgets.text("bronze_table", "account_change_event", "Bronze table")

catalog = dbutils.widgets.get("catalog")
bronze = f"{catalog}.{dbutils.widgets.get('bronze_schema')}"
silver = f"{catalog}.{dbutils.widgets.get('silver_schema')}"
gold = f"{catalog}.{dbutils.widgets.get('gold_schema')}"
table = dbutils.widgets.get("table")
bronze_table = dbutils.widgets.get("bronze_table")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Bronze: landing progress per topic
# MAGIC `sfcdc_checkpoints` holds one row per commit; the newest `events` or `keepalive` row of a
# MAGIC topic is where the next run resumes. `replay_gap` rows mark a corrupted-replay recovery.

# COMMAND ----------

display(
    spark.sql(
        """
        SELECT topic,
               max(committed_at) AS last_commit,
               sum(event_count) AS events,
               round(sum(payload_bytes) / 1e6, 1) AS payload_mb,
               count_if(kind = 'replay_gap') AS replay_gaps,
               max_by(hex(replay_id), batch_id) AS last_replay_id_hex
        FROM IDENTIFIER(:checkpoints)
        GROUP BY topic
        ORDER BY topic
        """,
        args={"checkpoints": f"{bronze}.sfcdc_checkpoints"},
    )
)

# COMMAND ----------

display(
    spark.sql(
        """
        SELECT batch_id, count(*) AS events, min(received_at) AS first_received,
               max(received_at) AS last_received, count(DISTINCT schema_id) AS schemas
        FROM IDENTIFIER(:bronze_table)
        GROUP BY batch_id
        ORDER BY batch_id DESC
        LIMIT 20
        """,
        args={"bronze_table": f"{bronze}.{bronze_table}"},
    )
)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Silver: the latest changes, and the quarantine

# COMMAND ----------

display(
    spark.sql(
        """
        SELECT Id, _cdc_change_type, _cdc_commit_timestamp, _cdc_commit_user,
               _cdc_changed_fields, _cdc_nulled_fields, _cdc_diff_fields
        FROM IDENTIFIER(:silver_table)
        ORDER BY _cdc_commit_timestamp DESC
        LIMIT 50
        """,
        args={"silver_table": f"{silver}.{table}"},
    )
)

# COMMAND ----------

display(
    spark.sql(
        """
        SELECT bronze_table, reason_kind, count(*) AS rows, max(quarantined_at) AS last_seen
        FROM IDENTIFIER(:quarantine)
        GROUP BY bronze_table, reason_kind
        ORDER BY rows DESC
        """,
        args={"quarantine": f"{silver}.sfcdc_quarantine"},
    )
)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Gold: current state, and what needs a re-sync

# COMMAND ----------

display(
    spark.sql(
        """
        SELECT *
        FROM IDENTIFIER(:gold_table)
        WHERE NOT _cdc_is_deleted
        ORDER BY _cdc_last_commit_ts DESC
        LIMIT 50
        """,
        args={"gold_table": f"{gold}.{table}"},
    )
)

# COMMAND ----------

display(
    spark.sql(
        """
        SELECT object, reason, count(*) AS open_rows, min(detected_at) AS oldest
        FROM IDENTIFIER(:resync)
        WHERE resolved_at IS NULL
        GROUP BY object, reason
        ORDER BY open_rows DESC
        """,
        args={"resync": f"{gold}.sfcdc_resync"},
    )
)
