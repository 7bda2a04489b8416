"""DP-auto-GAN: adapter (the generator interface) and trainer."""
