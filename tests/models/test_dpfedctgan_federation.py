"""DP-Fed-CTGAN's federation processes, without a release: on this machine the SuperLink admits only the
SuperNodes whose keys the launcher registered (federation/trust.py), and the launcher's stop leaves no
process of the groups it started. Real Flower processes (a SuperLink, a SuperNode): seconds each."""

from __future__ import annotations

import os
import time

import pytest

from dpsynth.models.generators.dpfedctgan.config import DPFedCTGANConfig
from dpsynth.models.generators.dpfedctgan.federation.launcher import (
    Ports,
    flower_env,
    superlink_argv,
    supernode_argv,
    wait_for_control,
    write_flower_home,
)
from dpsynth.models.generators.dpfedctgan.federation.processes import Processes
from dpsynth.models.generators.dpfedctgan.federation.trust import write_loopback_tls, write_site_keys

pytestmark = pytest.mark.slow


def test_a_supernode_with_an_unregistered_key_cannot_join_and_stop_leaves_no_process(tmp_path):
    c = DPFedCTGANConfig()
    ports = Ports.choose(c)
    tls = write_loopback_tls(tmp_path / "tls", c.server_host)
    procs = Processes(tmp_path, flower_env(write_flower_home(tmp_path, ports, tls)))
    try:
        procs.start("superlink", superlink_argv(c.server_host, ports, tls))
        wait_for_control(procs, ports, time.monotonic() + 60)
        (tmp_path / "site-0").mkdir(mode=0o700)
        key = write_site_keys(tmp_path / "site-0")  # a key pair the SuperLink was never told of
        assert oct((key.stat().st_mode) & 0o777) == "0o600"
        argv = supernode_argv(f"{c.server_host}:{ports.fleet}", tmp_path, 0, key, tls)
        stranger = procs.start("stranger", [*argv, "--max-retries", "1"])
        deadline = time.monotonic() + 60
        while stranger.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        log = (tmp_path / "logs" / "stranger.log").read_text(errors="replace")
        assert stranger.poll() not in (None, 0), log
        assert "No SuperNode found with the given public key" in log and "SuperNode ID" not in log
    finally:
        procs.stop()
    for proc in procs.started.values():
        with pytest.raises(ProcessLookupError):
            os.killpg(proc.pid, 0)
