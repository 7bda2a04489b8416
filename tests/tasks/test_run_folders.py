"""Run folders are owner-only whatever the umask; the default runs/ tree too, but a folder named with
--out leaves its parent (anyone's folder, /tmp included) as it was."""

import os

from dpsynth.tasks.context import load_context, open_run
from tests.conftest import CARDIO_SCHEMA


def _modes(*paths):
    return [p.stat().st_mode & 0o777 for p in paths]


def test_the_default_tree_is_owner_only_and_an_out_folder_keeps_its_parent(
    tmp_path, demo_csv, monkeypatch, private_home
):
    monkeypatch.chdir(tmp_path)
    loose = os.umask(0o022)
    try:
        shared = tmp_path / "shared"
        shared.mkdir(mode=0o755)
        named = load_context(str(CARDIO_SCHEMA), str(demo_csv), "smoke", str(shared / "run"), "release")
        open_run(named)
        assert _modes(shared, named.run_dir) == [0o755, 0o700]
        default = load_context(str(CARDIO_SCHEMA), str(demo_csv), "smoke", None, "release")
        open_run(default)
        # Without --out a run goes under the home, not the working folder.
        assert default.run_dir.parent == private_home / "runs" / "release" and not (tmp_path / "runs").exists()
        assert (
            _modes(private_home, private_home / "runs", private_home / "runs" / "release", default.run_dir)
            == [0o700] * 4
        )
        assert all(m & 0o077 == 0 for m in _modes(*default.run_dir.iterdir()))  # run.json, the secret
    finally:
        os.umask(loose)
