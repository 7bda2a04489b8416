"""Prefect flows and the command line: wiring only; the work is in tasks/ and models/."""

import os

# No analytics or telemetry leave the machine: the tables are sensitive, and the machines often offline.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")
