"""Dataset schemas (`*.yaml`) and run profiles (`profiles/*.yaml`), installed as `dpsynth.configs`."""
