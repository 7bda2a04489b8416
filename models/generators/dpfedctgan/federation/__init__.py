"""DP-Fed-CTGAN's federation on Flower (its gRPC server and clients, each a process of its own):
`server.py` (the server app: FedAvg weighted by the sites' noisy row counts, a checkpoint per round),
`client.py` (the client app: one site's rows, DP-SGD), `launcher.py` (starts them on one machine, or the
server alone for clients on other machines), `job.py` (the files they share, Flower's import and the processes' end)."""
