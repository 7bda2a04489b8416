"""What the two-phase generators share: DP-auto-GAN (models/generators/dpautogan) and RDP-CGAN
(models/generators/rdpcgan) both train a private autoencoder (phase 1), then a private WGAN critic
against a generator whose output the frozen decoder turns into rows (phase 2), and release the decoder
with the latent model. Each generator's package keeps only what differs (its networks, losses and
profile defaults); neither imports the other.

* config.py: the profile section's phase fields, their checks and step counts;
* trainer.py: `TwoPhaseTrainer`, both phases' private updates, one accountant, checkpoints, resumption;
* pairs.py: the critic's (real, fake) pairs: each real row's fake from its own row position;
* sampling.py: sampling a release (z -> latent model -> decoder, levels drawn from the decoder);
* schedule.py: the adapter's side: the checkpoints selection sees and their replace-one epsilons.
"""
