"""Gold: per-object current-state Delta tables folded from silver changes.

- :mod:`pipelines.gold.columns`: the gold schema (silver's body columns + control columns).
- :mod:`pipelines.gold.fold`: the pure fold of silver changes onto gold rows, with
  Salesforce's semantics, and the MERGE conditions.
- :mod:`pipelines.gold.resync`: the re-sync table (records gold cannot reproduce).
- :mod:`pipelines.gold.scd2`: the optional SCD2 history table.
- :mod:`pipelines.gold.job`: reading silver incrementally and MERGE-ing through the engine;
  :mod:`pipelines.gold.object_run` runs one object's steps, :mod:`pipelines.gold.dataflow`
  composes the fold with the engine, :mod:`pipelines.gold.tables` names the tables.
"""
