"""The analyst's API behind `dpsynth.Schema`, `dpsynth.release` and `dpsynth.load` (docs/api.md): small
modules over the pipeline's own machinery (the schema loader, the release flow with the command line's
checks, the generator samplers), so that a release from Python is governed exactly as one from the
command line."""
