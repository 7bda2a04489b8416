import json

from dpsynth.tasks.stage import run_stage


def _writer(calls):
    def work(directory):
        calls.append(directory)
        out = directory / "out.txt"
        out.write_text("done")
        return {"out": out}, {"n": len(calls)}

    return work


def test_completed_stage_is_skipped_and_rerun_when_inputs_change(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("a")
    calls = []
    first = run_stage(tmp_path / "run", "s", {"src": src}, {"k": 1}, _writer(calls))
    again = run_stage(tmp_path / "run", "s", {"src": src}, {"k": 1}, _writer(calls))
    assert not first.skipped and again.skipped and len(calls) == 1
    manifest = json.loads((tmp_path / "run" / "s" / "manifest.json").read_text())
    assert set(manifest) >= {"inputs", "config_hash", "outputs", "output_hashes", "seconds", "started"}
    src.write_text("b")
    assert not run_stage(tmp_path / "run", "s", {"src": src}, {"k": 1}, _writer(calls)).skipped
    assert not run_stage(tmp_path / "run", "s", {"src": src}, {"k": 2}, _writer(calls)).skipped
    assert len(calls) == 3


def test_failed_stage_leaves_no_manifest_and_keeps_partial_work_for_resume(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("a")

    def crash(directory):
        (directory / "partial.txt").write_text("half")
        raise RuntimeError("killed")

    try:
        run_stage(tmp_path / "run", "s", {"src": src}, {}, crash)
    except RuntimeError:
        pass
    stage_dir = tmp_path / "run" / "s"
    assert not (stage_dir / "manifest.json").exists()
    seen = []

    def resume(directory):
        seen.append((directory / "partial.txt").exists())
        out = directory / "out.txt"
        out.write_text("x")
        return {"out": out}, {}

    run_stage(tmp_path / "run", "s", {"src": src}, {}, resume)
    assert seen == [True]  # same inputs: the partial work is there to resume from


def test_partial_work_from_other_inputs_is_cleared(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("a")

    def crash(directory):
        (directory / "partial.txt").write_text("half")
        raise RuntimeError

    try:
        run_stage(tmp_path / "run", "s", {"src": src}, {}, crash)
    except RuntimeError:
        pass
    src.write_text("changed")
    seen = []

    def check(directory):
        seen.append((directory / "partial.txt").exists())
        out = directory / "o"
        out.write_text("")
        return {"o": out}, {}

    run_stage(tmp_path / "run", "s", {"src": src}, {}, check)
    assert seen == [False]


def test_a_reused_stage_says_so_unless_progress_is_off(tmp_path, capsys, monkeypatch):
    src = tmp_path / "in.txt"
    src.write_text("a")
    monkeypatch.delenv("DPSYNTH_PROGRESS", raising=False)
    for name in ("split", "evaluate-k10/003"):
        run_stage(tmp_path / "run", name, {"src": src}, {}, _writer([]))
        run_stage(tmp_path / "run", name, {"src": src}, {}, _writer([]))
    err = capsys.readouterr().err
    assert "split: reused" in err and "evaluate-k10/003" not in err  # selection runs: the progress display
    monkeypatch.setenv("DPSYNTH_PROGRESS", "off")  # --json
    run_stage(tmp_path / "run", "split", {"src": src}, {}, _writer([]))
    assert capsys.readouterr().err == ""
