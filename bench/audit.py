"""Privacy audit of the code that trains: an empirical lower bound on epsilon (models/audit.py).

`--mode step` (white box): the trainer's own query (`GeneratorTrainer.draw_critics` from the secret, then
`generator_step`: `query_critics`, clipping, noise, the generator's update; the functions `step` calls,
without the critic refresh, which planted critics do not need) runs with planted critics. Critic 0 holds
the canary: on the first input its gradient is the worst case, norm C in a fixed direction, for every
generated row; on the neighbour it is the opposite, which every other critic returns on both. Each trial
is T steps; the sanitised rows, projected on that direction, are scored by the likelihood ratio of a
mechanism (one critic per row, or one per step: whichever separates better on the calibration half of
the trials), and Clopper-Pearson bounds on its true and false positive rates give a lower bound on
epsilon at the claimed delta, with 95% confidence. Three audits, each for one step and for a few:

* per_row: dpsynth's mechanism against its accountant's claim (T x B queries): the bound must stay
  below the claim;
* per_step scored as T x B: the thesis' shared critic against the claim dpsynth used to make for it
  (the per-row accounting): the bound must exceed it, i.e. the audit catches the old bug;
* per_step: the shared critic against its own accounting (T queries at sigma / sqrt(B)).

K = 100 (sampling probability 0.01), B = 32, sigma = 1.07, delta = 1e-5, a tiny generator (the audit is
about the query, and the planted critics' gradients do not depend on it).

Usage: ``python bench/audit.py --mode step [--json] [--trials 20000] [--steps 1 5]`` (trials per input for
one step; trials of T steps are that over T, so every audit runs as many steps). The last line of
standard output is one JSON object: {"mode", "audits": [{"mechanism", "steps", "epsilon_claimed",
"epsilon_lower_bound", "trials", ...}], "seconds"}.
"""

from __future__ import annotations

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]   # bench/select.py
sys.path.insert(0, os.path.dirname(_here))

import argparse
import json
import time

import torch

from models.audit import StepAuditSetup, step_audit


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("step",), default="step")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--trials", type=int, default=20000,
                    help="trials per input of one step (of T steps: this over T)")
    ap.add_argument("--steps", type=int, nargs="+", default=[1, 5])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)   # as training runs on CPU: one iteration is many small operations
    started = time.perf_counter()
    setup = StepAuditSetup()
    audits = []
    for steps in args.steps:
        audits += step_audit(setup, max(1000, args.trials // steps), steps, args.seed)
    summary = {"mode": args.mode, "audits": audits, "seconds": round(time.perf_counter() - started, 1)}
    if not args.json:
        for a in audits:
            print(f"  {a['mechanism']}, {a['steps']} step(s): claimed {a['epsilon_claimed']}, "
                  f"lower bound {a['epsilon_lower_bound']} ({'REFUTED' if a['claim_refuted'] else 'consistent'})")
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
