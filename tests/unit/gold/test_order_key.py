"""The order key string sorts exactly like the tuple of values it encodes."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.gold.order_keys import column_key_parts, encode_order_key
from pipelines.gold.plan import order_columns

UTC = timezone.utc

_ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
_times = st.datetimes(
    min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
)
_floats = st.floats(allow_nan=False, allow_infinity=True)


def _none_first(value: object) -> tuple[int, object]:
    return (0, 0) if value is None else (1, value)


@pytest.mark.parametrize(
    "values",
    [
        st.tuples(st.none() | _times, st.none() | _ints, st.none() | _texts, _ints),
        st.tuples(_texts, _texts),
        st.tuples(st.binary(max_size=8), st.dates()),
        st.tuples(_floats, st.booleans()),
    ],
    ids=["default-shape", "texts", "binary-dates", "floats-booleans"],
)
def test_keys_sort_like_their_tuples(values: st.SearchStrategy) -> None:
    # No deadline: the first examples pay for loading pyarrow kernels on a shared machine.
    @settings(deadline=None)
    @given(values, values)
    def check(a: tuple[object, ...], b: tuple[object, ...]) -> None:
        ka, kb = encode_order_key(a), encode_order_key(b)
        ta, tb = tuple(map(_none_first, a)), tuple(map(_none_first, b))
        assert (ka < kb) == (ta < tb)
        assert (ka == kb) == (ta == tb)

    check()


def test_known_values() -> None:
    t = datetime(2025, 1, 1, tzinfo=UTC)
    key = encode_order_key([t, 7, "tx-1", None, True, date(1970, 1, 2)])
    assert key == (
        "1"
        + f"{1_735_689_600_000_000 + 2**63:016x}"
        + "1"
        + f"{7 + 2**63:016x}"
        + "1tx-1 "
        + "0"
        + "11"
        + "1"
        + f"{1 + 2**63:016x}"
    )
    assert encode_order_key([-0.0]) == encode_order_key([0.0])
    # Characters that would sort below the terminator are escaped.
    assert encode_order_key(["a b!"]) == "1a!20b!21 "
    assert encode_order_key([t.replace(tzinfo=None)]) == encode_order_key([t])
    assert encode_order_key([t + timedelta(microseconds=1)]) > encode_order_key([t])


def test_bad_values_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="64 bits"):
        encode_order_key([2**63])
    with pytest.raises(ValueError, match="NaN"):
        encode_order_key([float("nan")])
    with pytest.raises(TypeError, match="got a list"):
        encode_order_key([[1]])


def test_stream_order_is_always_the_final_tie_break() -> None:
    assert order_columns(["_cdc_commit_timestamp"]) == (
        "_cdc_commit_timestamp",
        "_cdc_bronze_batch_id",
        "_cdc_bronze_batch_seq",
    )
    assert order_columns(["_cdc_bronze_batch_seq", "x"]) == (
        "_cdc_bronze_batch_seq",
        "x",
        "_cdc_bronze_batch_id",
    )


@pytest.mark.parametrize(
    ("arrow_type", "values"),
    [
        (pa.timestamp("us", tz="UTC"), st.none() | _times),
        (pa.timestamp("ms", tz="UTC"), st.none() | _times.map(lambda t: t.replace(microsecond=0))),
        (pa.int64(), st.none() | _ints),
        (pa.int32(), st.none() | st.integers(-(2**31), 2**31 - 1)),
        (pa.date32(), st.none() | st.dates()),
        (pa.string(), st.none() | _texts),
        (pa.bool_(), st.none() | st.booleans()),
        (pa.float64(), st.none() | _floats),
        (pa.binary(), st.none() | st.binary(max_size=6)),
    ],
    ids=str,
)
def test_column_wise_keys_equal_value_by_value_keys(
    arrow_type: pa.DataType, values: st.SearchStrategy
) -> None:
    # The fold encodes a batch's keys column by column and a wildcard change's key value by
    # value: the two must agree byte for byte, or their order would be wrong.
    @settings(deadline=None)
    @given(st.lists(values, max_size=8))
    def check(column: list[object]) -> None:
        array = pa.array(column, type=arrow_type)
        expected = [encode_order_key([v]) for v in array.to_pylist()]
        assert column_key_parts(array).to_pylist() == expected
        # A column read from a table arrives in chunks.
        chunked = pa.chunked_array([array[:3], array[3:]], type=arrow_type)
        assert column_key_parts(chunked).to_pylist() == expected

    check()
