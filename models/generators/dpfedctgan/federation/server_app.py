"""The Flower ServerApp (component `serverapp` of the app in `flower_app/`): the SuperLink runs it in a
process of its own for the run the launcher submits, with the job folder in the run config (`folder`).

It asks every site's SuperNode once for its noisy counts (a `query` message), then sends each training
round's global weights and config (round index, level shares) to every site (a `train` message) and hands
the replies to server.py's arithmetic (FedAvg by noisy sizes, accountants, a checkpoint per round). It
waits `connect_timeout_s` for exactly as many SuperNodes as sites, and a round's replies
`round_timeout_s`: a site that fails, does not reply, or replies twice fails the round.

It serves the launcher's run only (guard.py): a run whose id is not the one the launcher recorded in
the job folder, or whose config names another folder than the launcher's, fails before the ServerApp
reads the job or writes anything (a run submitted by someone else to the SuperLink's Control API, which
has no client authentication). The launcher watches it through files in the job folder, not Flower's run
status: `server_app.pid` when it starts, then `server_done.txt` or `server_error.txt` (the reason) when it
ends; `logs/server.log` says what it did. Imports of torch and Flower wait for `main`: `flwr run` loads
this module to check the app before it submits the run.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

NODES_POLL_SECONDS = 0.2
# Flower's Grid.send_and_receive sleeps 3 s between its pulls of the replies: on a small job most of a
# round's wall time. The ServerApp pushes and pulls itself (the Grid's public calls), polling this often.
REPLIES_POLL_SECONDS = 0.2  # as NODES_POLL_SECONDS: each pull is a gRPC call to the SuperLink
COUNTS, TRAIN = "query", "train"  # Flower's message types: the counts' request, a training round

app = ServerApp()


def log(folder: Path, line: str) -> None:
    (folder / "logs").mkdir(exist_ok=True)
    with open(folder / "logs" / "server.log", "a") as handle:
        handle.write(f"{time.strftime('%H:%M:%S')} {line}\n")


def wait_for_sites(grid: Grid, sites: int, timeout_s: float) -> list[int]:
    """The SuperNodes' ids once exactly `sites` are connected; FederationError at the timeout, or when
    more than `sites` joined (a node that is not one of the split's sites)."""
    from dpsynth.models.generators.dpfedctgan.federation.server import FederationError

    deadline = time.monotonic() + timeout_s
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) > sites:
            raise FederationError(f"{len(nodes)} SuperNodes joined a federation of {sites} sites")
        if len(nodes) == sites:
            return nodes
        if time.monotonic() > deadline:
            raise FederationError(f"only {len(nodes)} of {sites} sites connected within {timeout_s:g} s")
        time.sleep(NODES_POLL_SECONDS)


def exchange(grid: Grid, messages: list[Message], timeout_s: float) -> list[Message]:
    """Push `messages` and pull their replies until all have come or `timeout_s` has passed (the replies
    in hand then): Grid.send_and_receive's contract, polled every REPLIES_POLL_SECONDS."""
    waiting = set(grid.push_messages(messages))
    deadline = time.monotonic() + timeout_s
    replies: list[Message] = []
    while True:
        pulled = list(grid.pull_messages(waiting))
        replies.extend(pulled)
        waiting.difference_update(reply.metadata.reply_to_message_id for reply in pulled)
        if not waiting or time.monotonic() >= deadline:
            return replies
        time.sleep(REPLIES_POLL_SECONDS)


def ask(grid: Grid, nodes: list[int], kind: str, content: RecordDict, what: str, timeout_s: float) -> list[Any]:
    """Send `content` to every node and return the sites' replies (server.SiteReply), unordered;
    FederationError when a site failed or did not reply within `timeout_s`."""
    from dpsynth.models.generators.dpfedctgan.federation.job import record_arrays
    from dpsynth.models.generators.dpfedctgan.federation.server import FederationError, SiteReply

    messages = [Message(content, dst_node_id=node, message_type=kind) for node in nodes]
    replies = exchange(grid, messages, timeout_s)
    failed = [f"{r.error.reason} (code {r.error.code})" for r in replies if r.has_error()]
    if failed or len(replies) < len(nodes):
        missing = len(nodes) - len(replies)
        reasons = "; ".join(failed + ([f"{missing} did not reply within {timeout_s:g} s"] if missing else []))
        raise FederationError(f"{what}: {len(failed) + missing} of {len(nodes)} sites failed ({reasons})")
    out = []
    for reply in replies:
        metrics: dict[str, Any] = dict(reply.content["metrics"])
        arrays = record_arrays(reply.content["weights"]) if "weights" in reply.content else []
        out.append(SiteReply(int(metrics["site"]), arrays, metrics))
    return out


def run_rounds(grid: Grid, folder: Path) -> None:
    """The counts, then the rounds left to the job's last (nothing when a rerun finds them done)."""
    import torch

    from dpsynth.models.generators.dpfedctgan.federation.job import FederationJob, weights_record
    from dpsynth.models.generators.dpfedctgan.federation.server import (
        FederatedState,
        FederationError,
        take_counts,
        take_round,
        train_config,
    )

    torch.set_num_threads(1)
    job = FederationJob.read(folder)
    state = FederatedState(job)
    c = job.config
    if state.round >= job.last_round and state.resumed:
        log(folder, f"serverapp: round {state.round} of {job.last_round} done already")
        return
    log(folder, f"serverapp: counts, then rounds {state.round + 1} to {job.last_round}")
    nodes = wait_for_sites(grid, job.sites, c.connect_timeout_s)
    take_counts(state, ask(grid, nodes, COUNTS, RecordDict(), "the counts", c.round_timeout_s))
    log(folder, f"serverapp: counts from {job.sites} sites")
    while state.round < job.last_round:
        what = f"round {state.round + 1}"
        weights = weights_record(state.generator, state.discriminator)
        content = RecordDict({"weights": weights, "config": ConfigRecord(train_config(state))})
        take_round(state, ask(grid, nodes, TRAIN, content, what, c.round_timeout_s))
        log(folder, f"serverapp: {what} of {job.last_round} averaged")
    if not state.ledger:
        raise FederationError(f"the server stopped after round {state.round} of {job.last_round}")


@app.main()
def main(grid: Grid, context: Context) -> None:
    from dpsynth.models.checkpoint_files import write_text_atomic
    from dpsynth.models.generators.dpfedctgan.federation.guard import our_run
    from dpsynth.models.generators.dpfedctgan.federation.job import DONE_FILE, ERROR_FILE, PID_FILE

    # Before anything else: another run fails here, leaving no file in the job folder.
    folder = our_run(context.run_id, context.run_config.get("folder", ""), required=True)
    write_text_atomic(str(os.getpid()), folder / PID_FILE)
    try:
        run_rounds(grid, folder)
    except Exception as exc:  # every failure ends the run with its reason for the launcher
        write_text_atomic(f"{type(exc).__name__}: {exc}\n", folder / ERROR_FILE)
        log(folder, f"serverapp failed: {type(exc).__name__}: {exc}")
        raise
    write_text_atomic("done\n", folder / DONE_FILE)
    log(folder, "serverapp: done")
