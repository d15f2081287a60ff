"""Silver: bronze's raw events decoded into one typed Delta table per object.

- :mod:`pipelines.silver.columns`: the silver columns of an object from its schema versions,
  and where each changed field name lands (:meth:`SilverLayout.column_for`).
- :mod:`pipelines.silver.decode`: decoding bronze payloads (:class:`SilverRows`, the step's
  batch function) and :mod:`pipelines.silver.shape`: decoded rows into silver rows.
- :mod:`pipelines.silver.quarantine`: silver and quarantine rows taken apart, undecodable
  bronze rows, the step's filters and counts.
- :mod:`pipelines.silver.job`: reading bronze incrementally, writing silver and quarantine;
  :mod:`pipelines.silver.topic_run` runs one group of a topic's objects in steps,
  :mod:`pipelines.silver.registry` reads the schema registry into silver layouts,
  :mod:`pipelines.silver.tables` names the tables and app ids.

The batch functions are pure and are the one definition of silver: the engine runs them in
this process (local) or on Spark executors (spark).
"""
