"""GS-WGAN (the thesis' generator): adapter (the generator interface), trainer, sanitiser."""
