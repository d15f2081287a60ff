"""Records a batch only creates are built column-wise instead of folded one by one;
:func:`tests.spark.gold.conftest.fold` checks each case on both engines."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest

from pipelines.engines import LakeEngine
from pipelines.gold.plan import FOLD_APPLIED, FOLD_CHANGES, FOLD_GOLD
from tests.lake_helpers import by_id
from tests.spark.gold.conftest import T0, Silver, fold, gold_of, resync_entries
from tests.spark.gold.helpers import assert_rows

EMPTY = {"Street": None, "City": None, "PostalCode": None, "Country": None}
LYON = {"Street": None, "City": "Lyon", "PostalCode": None, "Country": "FR"}


@pytest.mark.parametrize("compounds", ["struct", "flattened"])
def test_created_records_come_out_as_the_per_record_fold_makes_them(
    engine: LakeEngine, compounds: str
) -> None:
    first = Silver(compounds=compounds)
    first.create("001K", 0, Phone="known")
    gold = gold_of(engine, first)
    batch = first.next_batch()
    address = "BillingAddress" if compounds == "struct" else "BillingAddress_City"
    city = (lambda a: a) if compounds == "struct" else (lambda a: a and a["City"])
    batch.create("001A", 1, Phone="alone", LastModifiedDate=T0, **{address: city(LYON)})
    batch.create("001E", 1, Phone="empty address", **{address: city(EMPTY)})
    batch.create("001U", 2, Phone="created")
    batch.update("001U", 3, Phone="then updated")
    batch.create("001K", 4, Phone="created again")
    twice = batch.create("001D", 5, Phone="delivered twice")
    batch.add("001D", "CREATE", 5, event=twice["_cdc_event_id"], Phone="delivered twice")
    batch.add(None, "CREATE", 6, Phone="no record id")
    folded = fold(engine, batch, gold=gold)
    with_ids = engine.to_arrow(folded).filter(pc.is_valid(pc.field("Id")))
    assert_rows(
        engine,
        with_ids,
        ["Id", "Phone", FOLD_GOLD, FOLD_CHANGES, FOLD_APPLIED],
        [
            ("001A", "alone", "upsert", 1, 1),
            ("001E", "empty address", "upsert", 1, 1),
            ("001U", "then updated", "upsert", 2, 2),
            ("001K", "created again", "upsert", 1, 1),
            ("001D", "delivered twice", "upsert", 2, 1),
        ],
    )
    if compounds == "struct":
        addresses = {i: r["BillingAddress"] for i, r in by_id(engine, with_ids).items()}
        assert addresses["001E"] is None
        assert addresses["001A"] == LYON
    assert_rows(
        engine, resync_entries(engine, folded), ["record_id", "reason"], [(None, "unknown_field")]
    )
