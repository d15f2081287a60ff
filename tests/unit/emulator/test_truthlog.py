"""The records an emulator serves survive a restart on the same state directory: the truth
journal written beside the event log rebuilds the same ground truth, gap and overflow events
included, and a last line cut short by a crash is dropped."""

from __future__ import annotations

import copy
from pathlib import Path

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.server import Emulator, EmulatorConfig
from ingest.emulator.truthlog import TRUTH_JOURNAL, TruthJournal
from ingest.emulator.workload import Workload, WorkloadMix

MIX = WorkloadMix(platform_event=0.0, gap=3.0, overflow=0.5, wildcard=0.3)


def test_a_restarted_emulator_answers_for_the_same_records(tmp_path: Path) -> None:
    catalogue = default_catalogue()
    first = Emulator(catalogue, EmulatorConfig(state_dir=tmp_path))
    workload = Workload(catalogue, seed=11, mix=MIX)
    first.serve_records(workload.truth)
    for _ in range(3):
        first.append(list(workload.events(80)))
    first.close()
    truth = workload.truth
    assert any(truth.resync(e).record_ids for e in truth.entities), "no gap event generated"

    second = Emulator(default_catalogue(), EmulatorConfig(state_dir=tmp_path))
    try:
        assert second.records == truth
        for entity in truth.entities:
            assert second.records is not None
            assert second.records.resync(entity) == truth.resync(entity)
    finally:
        second.close()
    # Loading compacted the journal to its header and one line.
    assert len((tmp_path / TRUTH_JOURNAL).read_text().splitlines()) == 2


def test_a_line_cut_short_is_dropped(tmp_path: Path) -> None:
    catalogue = default_catalogue()
    workload = Workload(catalogue, seed=3)
    journal = TruthJournal(tmp_path)
    journal.start(workload.truth)
    list(workload.events(40))
    journal.record(workload.truth)
    kept = copy.deepcopy(workload.truth)
    list(workload.events(40))
    journal.record(workload.truth)
    journal.close()
    path = tmp_path / TRUTH_JOURNAL
    text = path.read_text()
    path.write_text(text[: len(text) - 20])
    assert kept != workload.truth
    assert TruthJournal(tmp_path).load() == kept
