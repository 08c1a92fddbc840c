"""The review reads one snapshot of a live store (#48 item 4): a sidecar's writer appending rows
of a model the review's first query did not see never makes a later query meet it
(`GET /headroom/v1/report` answered 500, KeyError on the new model, in 2 of 3 audit runs)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from support.synthetic import synthetic_rows

from collector.report.collect import collect_inputs
from collector.store.db import RequestStore, SnapshotReads

START = datetime(2026, 3, 2, 9, tzinfo=UTC)


def test_a_snapshot_does_not_see_rows_written_after_it_began(tmp_path):
    store = RequestStore(tmp_path / "log.duckdb")
    store.insert_rows(synthetic_rows(10, START))
    with store.one_snapshot() as snapshot:
        store.insert_rows(synthetic_rows(5, START, models=("peer",), prefix="late"))
        assert snapshot.query("SELECT count(*) FROM requests") == [(10,)]
        assert snapshot.numpy("SELECT DISTINCT model FROM requests")["model"].tolist() == ["model-a"]
    assert store.count() == 15  # the writer's rows are there for the next reader
    store.close()


def test_the_review_meets_no_model_that_arrived_between_its_queries(tmp_path, monkeypatch):
    store = RequestStore(tmp_path / "log.duckdb")
    store.insert_rows(synthetic_rows(300, START, span=timedelta(hours=2)))
    written = []

    def racing(original):
        def query_dicts(self, sql, params=()):
            found = original(self, sql, params)
            if not written:  # right after the review's first query: a new model's rows land
                written.append(store.insert_rows(synthetic_rows(40, START, models=("peer",), prefix="late")))
            return found

        return query_dicts

    for reader in (RequestStore, SnapshotReads):  # whichever the review reads through
        monkeypatch.setattr(reader, "query_dicts", racing(reader.query_dicts))
    inputs = collect_inputs(store, START, START + timedelta(hours=2))
    assert written == [40]
    assert set(inputs.models) == {"model-a"}  # the window as it was when the review began
    monkeypatch.undo()
    assert set(collect_inputs(store, START, START + timedelta(hours=2)).models) == {"model-a", "peer"}
    store.close()
