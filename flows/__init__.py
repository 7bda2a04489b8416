"""Prefect flows and the command line: wiring only; the work is in tasks/ and models/."""

import os

# No analytics or telemetry leave the machine: the tables are sensitive, and the machines often offline.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")
# Prefect's temporary API server gets 20 s to answer by default; on a busy two-core machine (a federation's
# processes, another release) it took longer and the release died before its first stage. Two minutes.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
