"""Silver: bronze's raw events decoded into one typed Delta table per object.

- :mod:`pipelines.silver.columns`: the silver columns of an object from its schema versions,
  and where each changed field name lands (:meth:`SilverLayout.column_for`).
- :mod:`pipelines.silver.decode`: the ``mapInArrow`` decoding of bronze payloads.
- :mod:`pipelines.silver.transforms`: the pure DataFrame steps.
- :mod:`pipelines.silver.job`: reading bronze incrementally, writing silver and quarantine.
"""
