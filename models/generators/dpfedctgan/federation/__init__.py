"""DP-Fed-CTGAN's federation on Flower's deployment engine (a SuperLink, one SuperNode per site, each a
process of its own): `server_app.py` (the ServerApp: the counts, then the rounds), `server.py` (its state
and arithmetic: FedAvg weighted by the sites' noisy row counts, a checkpoint per round), `client.py` (the
ClientApp: one site's rows, DP-SGD), `flower_app/` (the app `flwr run` submits), `launcher.py` and
`processes.py` (start them on one machine, or the SuperLink alone for SuperNodes on other machines, and
stop every process), `trust.py` (TLS and SuperNode keys per run), `guard.py` (only the launcher's app,
in the launcher's run, runs in the app processes), `job.py` (the files and the wire format they share)."""
