"""Privacy audit of the code that trains: an empirical lower bound on epsilon (models/privacy/audit.py).

`--mode calibration` (white box, one query at a time): each sanitising function runs on a canary pair
whose outputs differ by the whole sensitivity, without subsampling, so that its exact epsilon is a
Gaussian mechanism's (models/privacy/exact_loss.py) and is carried by events of probability 1e-4 to 1e-3, which
10^6 trials per input reach. Scores are projections of the released output on the canary's direction;
the threshold is chosen on a calibration half, and Clopper-Pearson bounds on the other half give a
lower bound at 95%. Five mechanisms:

* gswgan-sanitiser: `GeneratorTrainer.generator_step` with every critic planted with the canary's
  gradient (+g on the first input, -g on the neighbour, norm 10 C), 10^6 sanitised rows per input
  (31,250 steps of B = 32), sigma = 1.07: exact 4.05 (mu = 1 / sigma); passes with a bound in
  [2.5, exact];
* dpcgan-update: `dpsynth.models.generators.dpcgan.trainer.sanitized_gradient` on a one-layer
  discriminator; dpautogan-update: `ghost_clipped_sum` then `dpsgd.noisy_mean`, as training
  runs them, on a network whose rows' gradients are the canaries. A canary of norm 100 C, +-g; sigma = 2.14
  (mu = 2C / (sigma C)): exact 4.05. Many canaries per call, each in gradient coordinates of its own,
  give many trials per call;
* dpautogan-gaussian-fit (`noisy_sums` of `latent_statistics` with `gaussian_bound`, sigma 1.4) and
  dpautogan-moments (`private_moments`, sigma 1.5, one call per trial): a canary pair of corner rows;
  exact is that pair's (mu = ||v(x) - v(x')|| / (sigma bound)), about 4.1; the replace-one claim must
  cover it;
* measured-marginals (`noisy_marginal`, sigma 1.07, one call per trial): a canary row moved from one
  level of a three-level column to another (one count down, one up); exact: mu = 1 / sigma, 4.05.

Then each generator's own (its package's audit.py, listed through its registration:
models/generators/audit_table.py): MST's and AIM's Gaussian measurement (`gaussian_counts` at the budget's
std, exact: mu = sqrt(2 rho charged)) and exponential selection (`exponential_mechanism` at the budget's
epsilon over scores moved by the whole sensitivity, scored by the choice's likelihood ratio; exact: that
pair of choice distributions'), RDP-CGAN's critic update (`RDPCGANTrainer.critic_update`, pair gradients
planted) and DP-Fed-CTGAN's client update (`sanitized_gradient` on given fakes), mu = 2 / sigma.

The last five and the generators' pass with a bound in [0.6 exact, exact]. `--halve-noise` (a check of
the audit, never of a release) runs every mechanism at half its noise multiplier and judges it against the exact epsilon
of the intended one: each audit must then refute it (bound > exact).

`--mode step` (white box): the trainer's own query (`GeneratorTrainer.draw_critics` from the secret, then
`generator_step`: `query_critics`, clipping, noise, the generator's update; the functions `step` calls,
without the critic refresh, which planted critics do not need) runs with planted critics. Critic 0 holds
the canary: on the first input its gradient is the worst case, norm C in a fixed direction, for every
generated row; on the neighbour it is the opposite, which every other critic returns on both. Each trial
is T steps; the sanitised rows, projected on that direction, are scored by the likelihood ratio of a
mechanism (one critic per row, or one per step: whichever separates better on the calibration half of
the trials), and Clopper-Pearson bounds on its true and false positive rates give a lower bound on
epsilon at the claimed delta, with 95% confidence. Three audits:

* per_row: dpsynth's mechanism against its accountant's claim (T x B queries): the bound must stay
  below the claim and below the exact epsilon;
* per_step scored as T x B: the thesis' shared critic against the claim dpsynth used to make for it
  (the per-row accounting): at large K the bound exceeds it, i.e. the audit catches the old bug;
* per_step: the shared critic against its own accounting (T queries at sigma / sqrt(B)).

Each carries `epsilon_exact`, the exact epsilon of the mechanism that ran (models/privacy/exact_loss.py),
which the RDP claim overstates (K = 10, one step: exact 3.76, claim 7.69). Defaults: K = 10
(`--discriminators`; 100 for the earlier setting), B = 32, sigma = 1.07, delta = 1e-5, T = 1
(`--steps`), 10^5 steps per input, a tiny generator (the audit is about the query, and the planted
critics' gradients do not depend on it).

`--mode release` (models/generators/mst/release_audit.py): MST at whole-release epsilon 1 (`--epsilon`) on a
worst-case three-column table, `--runs` runs of its private steps (`fit.measure`; the estimate is
post-processing) per input, with a canary row and with its replacement, in two processes (`--workers`);
each run scored by its Gaussian log-likelihood ratio plus its tree's log-ratio, and a Gaussian-DP audit of
the test's trade-off curve (models/privacy/gdp_audit.py) gives a lower bound on mu and the epsilon it implies.
A benchmark, not a CI test.

`--mode train` (black box, Steinke, Nasr and Jagielski 2023): the shipped generator (conditioned, Gumbel
head, EMA, a critic per sanitised row) trained on a generated 100-row table plus 200 canaries (distinct
extreme, schema-valid rows at corners of the public bounds), each included with probability 1/2; the
synthetic table alone scores each canary (distance to its nearest synthetic row of the same label), the
40 closest are guessed included and the 40 farthest excluded, and the correct guesses give an epsilon
lower bound at 95% (pooled over `--runs` runs). Once with the sanitiser, once without (no clipping, no
noise): a leak must show as a clearly higher bound. K = 1 so that the sanitiser is the only protection
(its claim is then very large: no amplification by subsampling).

Usage: ``python -m bench.audit --mode calibration [--json] [--trials 1000000] [--halve-noise]
[--mechanisms gswgan-sanitiser ...]``; ``python -m bench.audit --mode step [--json] [--trials 100000]
[--steps 1 5] [--discriminators 10]`` (trials per input for one step; trials of T steps are that over
T, so every audit runs as many steps); ``python -m bench.audit --mode train [--json] [--runs 3]``;
``python -m bench.audit --mode release [--json] [--runs 100000] [--epsilon 1] [--workers 2]``. The
last line of standard output is one JSON object: {"mode", "audits": [{"mechanism" or "sanitiser",
"epsilon_claimed", "epsilon_lower_bound", ...}], "seconds"} (calibration adds "passed": every audit
passed).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from dpsynth.models.generators.audit_table import calibration_audit_table, calibration_audits
from dpsynth.models.generators.gswgan.audit import StepAuditSetup, TrainAuditSetup, step_audit, train_audit
from dpsynth.models.privacy.audit import pooled_train_audit

ROOT = Path(__file__).resolve().parent.parent

DEFAULT_TRIALS = {"step": 100_000, "calibration": 1_000_000}


def step_audits(args) -> list[dict]:
    setup, audits = StepAuditSetup(discriminators=args.discriminators), []
    trials = args.trials or DEFAULT_TRIALS["step"]
    for steps in args.steps:
        audits += step_audit(setup, max(1000, trials // steps), steps, args.seed)
    return audits


def calibration(args) -> list[dict]:
    return calibration_audits(
        args.trials or DEFAULT_TRIALS["calibration"], args.halve_noise, args.mechanisms, args.seed
    )


def release_audits(args) -> list[dict]:
    from dpsynth.models.generators.mst.release_audit import ReleaseAuditSetup, release_audit

    setup = ReleaseAuditSetup(epsilon=args.epsilon, runs=args.runs or ReleaseAuditSetup.runs)
    return [release_audit(setup, seed=args.seed, workers=args.workers)]


def train_audits(args) -> list[dict]:
    from dpsynth.models.data.schema import DatasetSchema

    schema = DatasetSchema.from_yaml(ROOT / "configs" / "cardio.yaml")
    setup, audits = TrainAuditSetup(), []
    for private in (True, False):
        runs = [train_audit(schema, setup, private, seed=args.seed + i) for i in range(args.runs or 3)]
        bound = pooled_train_audit(runs, setup.delta)
        claimed = max(r["epsilon_claimed"] for r in runs)
        audits.append(
            {
                "sanitiser": "on" if private else "off",
                "epsilon_claimed": round(claimed, 4) if claimed != float("inf") else None,
                "epsilon_lower_bound": round(bound, 4),
                "claim_refuted": bool(bound > claimed),
                "confidence": 0.95,
                "runs": args.runs or 3,
                "canaries": sum(r["canaries"] for r in runs),
                "guesses": sum(r["guesses"] for r in runs),
                "correct": sum(r["correct"] for r in runs),
                "discriminators": setup.discriminators,
                "iterations": setup.iterations,
                "base_rows": setup.base_rows,
                "delta": setup.delta,
            }
        )
    return audits


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("step", "calibration", "train", "release"), default="step")
    ap.add_argument(
        "--runs",
        type=int,
        default=None,
        help="--mode train: training runs pooled per variant (default 3); --mode release: runs per input "
        "(default 100000)",
    )
    ap.add_argument("--epsilon", type=float, default=1.0, help="--mode release: MST's whole-release epsilon")
    ap.add_argument("--workers", type=int, default=2, help="--mode release: processes (one per input)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--trials",
        type=int,
        default=None,
        help="trials per input: --mode step, of one step (of T steps: this over T; default 100000); "
        "--mode calibration, of each mechanism (default 1000000)",
    )
    ap.add_argument("--steps", type=int, nargs="+", default=[1], help="--mode step: T of each audit")
    ap.add_argument("--discriminators", type=int, default=10, help="--mode step: K")
    mechanisms = list(calibration_audit_table())
    ap.add_argument(
        "--mechanisms",
        nargs="+",
        choices=mechanisms,
        default=mechanisms,
        help="--mode calibration: which mechanisms to audit",
    )
    ap.add_argument(
        "--halve-noise",
        action="store_true",
        help="--mode calibration, a check of the audit itself: run every mechanism at half its noise "
        "multiplier, judged against the exact epsilon of the intended one (each must be refuted)",
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # as training runs on CPU: one iteration is many small operations
    started = time.perf_counter()
    modes = {"step": step_audits, "calibration": calibration, "train": train_audits, "release": release_audits}
    audits = modes[args.mode](args)
    summary = {"mode": args.mode, "audits": audits, "seconds": round(time.perf_counter() - started, 1)}
    if args.mode == "calibration":
        summary["halve_noise"] = args.halve_noise
        summary["passed"] = all(a["passed"] for a in audits)
    if not args.json and args.mode == "release":
        a = audits[0]
        print(
            f"  MST at epsilon {a['epsilon_claimed']} (rho {a['rho']:.4g}): mu lower bound {a['mu_lower_bound']} "
            f"(MST's rho as a Gaussian: {a['mu_of_rho']}), epsilon lower bound {a['epsilon_lower_bound']} "
            f"({a['bound_over_claim']} of the claim), {a['runs']} runs per input, {a['seconds']} s"
        )
    elif not args.json:
        for a in audits:
            what = a.get("mechanism") or f"sanitiser {a['sanitiser']}"
            if args.mode == "calibration":
                print(
                    f"  {what}: exact {a['epsilon_exact']}, claimed {a['epsilon_claimed']}, lower bound "
                    f"{a['epsilon_lower_bound']} from {a['trials']} trials per input, {a['seconds']} s "
                    f"({'pass' if a['passed'] else 'FAIL'}{', exceeds exact' if a['exceeds_exact'] else ''})"
                )
                continue
            exact = f", exact {a['epsilon_exact']}" if "epsilon_exact" in a else ""
            print(
                f"  {what}, {a.get('steps', a.get('iterations'))}: claimed {a['epsilon_claimed'] or 'infinity'}"
                f"{exact}, lower bound {a['epsilon_lower_bound']} "
                f"({'REFUTED' if a['claim_refuted'] else 'consistent'})"
            )
    print(json.dumps(summary, allow_nan=False), flush=True)
    return summary


if __name__ == "__main__":
    main()
