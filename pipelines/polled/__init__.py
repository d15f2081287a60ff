"""Objects without change events (``kind: polled``), read by incremental queries on
``SystemModstamp`` and carried through the same bronze, silver and gold as change event objects.

- :mod:`pipelines.polled.poll`: the polls, landed in bronze exactly once with their watermark;
- :mod:`pipelines.polled.tables`: the polled bronze table and where an object's polls stand;
- :mod:`pipelines.polled.layout`: the object's columns from the describes its polls stored;
- :mod:`pipelines.polled.rows`: a poll's records as silver rows (the pure batch function);
- :mod:`pipelines.polled.silver`: the silver step of a polled object.

Gold folds a polled row as a full image (``POLLED``, ``POLLED_DELETED``:
:mod:`pipelines.gold.fold`), with the gold job's own MERGE, tombstones, SCD2 history and re-sync
table (:func:`pipelines.gold.job.run_gold`).
"""

from pipelines.polled.layout import polled_layout
from pipelines.polled.poll import PollResult, due, poll_objects, select_polled
from pipelines.polled.silver import run_polled_silver
from pipelines.polled.tables import POLLED_SCHEMA, PollState, poll_state, polled_table

__all__ = [
    "POLLED_SCHEMA",
    "PollResult",
    "PollState",
    "due",
    "poll_objects",
    "poll_state",
    "polled_layout",
    "polled_table",
    "run_polled_silver",
    "select_polled",
]
