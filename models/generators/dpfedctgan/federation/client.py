"""The Flower ClientApp of one site (component `clientapp` of the app in `flower_app/`): a site's SuperNode
runs it, in a process of its own per request, with the site's index and job folder from the SuperNode's
`--node-config 'site=K folder="FOLDER"'`.

It reads the public job (`FOLDER/job.json`) and ONLY its own site's rows and secret (`FOLDER/site-K/`),
and sends the server exactly: for the `query` request, its noisy counts (conditions.py); for each `train`
request, its new weights after DP-SGD (local_training.py) and the number of sanitised updates it took
(public: the section's local_steps). Its row count leaves it only inside the noisy counts, which come from
the site's own stream: every request (and a restarted site) sends the same.

Under the launcher on this machine it serves the launcher's run only (guard.py): a request of any other
run fails before the ClientApp reads the job or the site's rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


class SiteClient:
    """What one site computes for each of the server's requests."""

    def __init__(self, folder: Path, site: int):
        import numpy as np
        import torch

        from dpsynth.models.generators.dpfedctgan.conditions import noisy_counts
        from dpsynth.models.generators.dpfedctgan.federation.job import ROWS_FILE, FederationJob, site_folder
        from dpsynth.models.generators.dpfedctgan.local_training import site_counts_stream
        from dpsynth.models.privacy import secret as secrets

        torch.set_num_threads(1)
        self.job = FederationJob.read(folder)
        here = site_folder(folder, site)
        self.site = int(site)
        self.rows = torch.from_numpy(np.load(here / ROWS_FILE))
        self.secret = secrets.load(here)
        self.counts = noisy_counts(
            self.rows, self.job.spec.layout, self.job.config.counts_noise, site_counts_stream(self.secret)
        )

    def train(self, arrays: list, round_index: int, shares: list[float]) -> tuple[list, int]:
        """The site's weights after `local_steps` DP-SGD updates from `arrays`, and the updates taken."""
        import torch

        from dpsynth.models.generators.dpfedctgan.federation.job import load_arrays
        from dpsynth.models.generators.dpfedctgan.local_training import SiteTrainer

        trainer = SiteTrainer(
            self.rows,
            self.job.spec,
            self.job.config,
            seed=self.job.seed,
            site=self.site,
            secret=self.secret,
            shares=torch.tensor(shares, dtype=torch.float32),
            noisy_size=float(self.counts[0]),
        )
        load_arrays(trainer.generator, trainer.discriminator, arrays)
        steps = trainer.run_round(round_index)
        return [trainer.generator, trainer.discriminator], steps


def this_site(context: Context) -> SiteClient:
    """The SuperNode's own site: its index and job folder from the node config, nothing else; first,
    when the launcher started the SuperNode, the run must be the launcher's (guard.py)."""
    from dpsynth.models.generators.dpfedctgan.federation.guard import our_run

    folder = our_run(context.run_id, context.node_config["folder"], required=False)
    return SiteClient(folder, int(context.node_config["site"]))


@app.query()
def counts(message: Message, context: Context) -> Message:
    site = this_site(context)
    metrics = MetricRecord({"site": site.site, "counts": [float(x) for x in site.counts]})
    return Message(RecordDict({"metrics": metrics}), reply_to=message)


@app.train()
def train(message: Message, context: Context) -> Message:
    from dpsynth.models.generators.dpfedctgan.federation.job import record_arrays, weights_record

    site = this_site(context)
    config: dict[str, Any] = dict(message.content["config"])
    (generator, discriminator), steps = site.train(
        record_arrays(message.content["weights"]), int(config["round"]), [float(x) for x in config["shares"]]
    )
    content = RecordDict(
        {
            "weights": weights_record(generator, discriminator),
            "metrics": MetricRecord({"site": site.site, "steps": int(steps)}),
        }
    )
    return Message(content, reply_to=message)
