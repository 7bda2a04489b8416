"""DP-CGAN: adapter (the generator interface) and trainer."""
