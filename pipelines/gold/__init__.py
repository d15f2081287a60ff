"""Gold: per-object current-state Delta tables folded from silver changes.

- :mod:`pipelines.gold.columns`: the gold schema (silver's body columns + control columns).
- :mod:`pipelines.gold.plan`: what the fold of an object needs
  (:class:`~pipelines.gold.plan.FoldPlan`) and the rows it reads and returns.
- :mod:`pipelines.gold.fold`: the pure fold of silver changes onto their records' gold rows,
  with Salesforce's semantics, column by column; :mod:`pipelines.gold.folding` runs it over
  Arrow tables, and :mod:`pipelines.gold.order_keys` encodes the order keys.
- :mod:`pipelines.gold.resync`: the re-sync table (records gold cannot reproduce).
- :mod:`pipelines.gold.scd2`: the optional SCD2 history table.
- :mod:`pipelines.gold.job`: reading silver incrementally and MERGE-ing through the engine;
  :mod:`pipelines.gold.object_run` runs one object's steps (and holds the MERGE conditions),
  :mod:`pipelines.gold.dataflow` composes the fold with the engine,
  :mod:`pipelines.gold.tables` names the tables.
"""
