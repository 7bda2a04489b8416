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

`--mode train` (black box, Steinke, Nasr and Jagielski 2023): the shipped generator (conditioned, Gumbel
head, EMA, a critic per sanitised row) trained on a generated 100-row table plus 200 canaries (distinct
extreme, schema-valid rows at corners of the public bounds), each included with probability 1/2; the
synthetic table alone scores each canary (distance to its nearest synthetic row of the same label), the
40 closest are guessed included and the 40 farthest excluded, and the correct guesses give an epsilon
lower bound at 95% (pooled over `--runs` runs). Once with the sanitiser, once without (no clipping, no
noise): a leak must show as a clearly higher bound. K = 1 so that the sanitiser is the only protection
(its claim is then very large: no amplification by subsampling).

Usage: ``python bench/audit.py --mode step [--json] [--trials 20000] [--steps 1 5]`` (trials per input for
one step; trials of T steps are that over T, so every audit runs as many steps), or
``python bench/audit.py --mode train [--json] [--runs 3]``. The last line of standard output is one JSON
object: {"mode", "audits": [{"mechanism" or "sanitiser", "epsilon_claimed", "epsilon_lower_bound", ...}],
"seconds"}.
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

from models.audit import StepAuditSetup, TrainAuditSetup, pooled_train_audit, step_audit, train_audit


def step_audits(args) -> list[dict]:
    setup, audits = StepAuditSetup(), []
    for steps in args.steps:
        audits += step_audit(setup, max(1000, args.trials // steps), steps, args.seed)
    return audits


def train_audits(args) -> list[dict]:
    from models.schema import DatasetSchema

    schema = DatasetSchema.from_yaml(os.path.join(os.path.dirname(_here), "configs", "cardio.yaml"))
    setup, audits = TrainAuditSetup(), []
    for private in (True, False):
        runs = [train_audit(schema, setup, private, seed=args.seed + i) for i in range(args.runs)]
        bound = pooled_train_audit(runs, setup.delta)
        claimed = max(r["epsilon_claimed"] for r in runs)
        audits.append({"sanitiser": "on" if private else "off",
                       "epsilon_claimed": round(claimed, 4) if claimed != float("inf") else None,
                       "epsilon_lower_bound": round(bound, 4), "claim_refuted": bool(bound > claimed),
                       "confidence": 0.95, "runs": args.runs, "canaries": sum(r["canaries"] for r in runs),
                       "guesses": sum(r["guesses"] for r in runs), "correct": sum(r["correct"] for r in runs),
                       "discriminators": setup.discriminators, "iterations": setup.iterations,
                       "base_rows": setup.base_rows, "delta": setup.delta})
    return audits


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("step", "train"), default="step")
    ap.add_argument("--runs", type=int, default=3, help="--mode train: training runs pooled per variant")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--trials", type=int, default=20000,
                    help="trials per input of one step (of T steps: this over T)")
    ap.add_argument("--steps", type=int, nargs="+", default=[1, 5])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)   # as training runs on CPU: one iteration is many small operations
    started = time.perf_counter()
    audits = step_audits(args) if args.mode == "step" else train_audits(args)
    summary = {"mode": args.mode, "audits": audits, "seconds": round(time.perf_counter() - started, 1)}
    if not args.json:
        for a in audits:
            what = a.get("mechanism") or f"sanitiser {a['sanitiser']}"
            print(f"  {what}, {a.get('steps', a.get('iterations'))}: claimed {a['epsilon_claimed'] or 'infinity'}, "
                  f"lower bound {a['epsilon_lower_bound']} ({'REFUTED' if a['claim_refuted'] else 'consistent'})")
    print(json.dumps(summary, allow_nan=False), flush=True)
    return summary


if __name__ == "__main__":
    main()
