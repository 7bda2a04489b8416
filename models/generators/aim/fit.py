"""Fitting AIM on a decoded table: every value coded into its column's public cells
(dpsynth.models.data.binning), the cells that can hold no value dropped from the domain (public: a fact
of the bounds and the decimal grid), AIM's rounds (models/generators/aim/mechanism.py), and the final
estimate's junction tree released as MST's model (models/generators/graphical/model.py), normalised."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dpsynth.models.data.binning import writable_cells
from dpsynth.models.data.cell_counts import CellCounts, Clique, count_frame
from dpsynth.models.data.schema import Column
from dpsynth.models.errors import ConfigError
from dpsynth.models.generators.aim import mechanism
from dpsynth.models.generators.aim.config import (
    DEFAULT_NUMERIC_PAIR_GROUPS,
    DEFAULT_NUMERIC_PAIR_SHARE,
    DEFAULT_NUMERIC_PAIR_WEIGHT,
    DEFAULT_PAIR_ROUND_GROUPS,
    OneWayRule,
)
from dpsynth.models.generators.aim.privacy import AIMBudget, derived_one_way_share
from dpsynth.models.generators.graphical.model import MSTModel, released_cliques

# A declared share, or the rule that derives one from public facts (`auto`: the rule's defaults).
OneWayShare = float | str | OneWayRule


@dataclass(frozen=True)
class Fitted:
    model: MSTModel
    info: dict  # DP outputs and public facts: the rounds, the budget, the rho ledger
    loss: float  # the estimator's final loss on the noisy measurements (internal)
    seconds: dict


def writable_map(col: Column, bins: int) -> np.ndarray:
    """Cell -> code in AIM's domain: the writable cells in order, -1 for a cell no value can take."""
    writable = writable_cells(col, bins)
    mapping = np.full(len(writable), -1, dtype=np.int64)
    mapping[writable] = np.arange(int(writable.sum()))
    return mapping


def fit(
    table: pd.DataFrame,
    columns: Sequence[Column],
    target: str,
    rho: float,
    noise: mechanism.Noise,
    *,
    bins: int,
    rounds: int | None,
    max_model_mb: float,
    round_iterations: int,
    iterations: int,
    workload: str,
    numeric_pair_weight: float = DEFAULT_NUMERIC_PAIR_WEIGHT,
    numeric_pair_groups: int = DEFAULT_NUMERIC_PAIR_GROUPS,
    one_way_share: OneWayShare = 0.0,
    numeric_pair_share: float = DEFAULT_NUMERIC_PAIR_SHARE,
    pair_round_groups: int = DEFAULT_PAIR_ROUND_GROUPS,
) -> Fitted:
    """AIM at zCDP `rho` (replace-one) on `table`'s `columns`, every value already in a cell (imputed)."""
    columns = tuple(columns)
    if len(table) < 1:
        raise ConfigError("AIM needs at least one training row")
    # Refused before counting.
    budget(columns, rho, rounds, one_way_share, numeric_pair_share, bins=bins, rows=len(table))
    cliques = counted_cliques(columns, target, workload, numeric_pair_weight)
    counts = count_frame(table, columns, bins, cliques, reader="AIM")
    return fit_counts(
        counts, columns, target, rho, noise, bins=bins, rounds=rounds, max_model_mb=max_model_mb,
        round_iterations=round_iterations, iterations=iterations, workload=workload,
        numeric_pair_weight=numeric_pair_weight, numeric_pair_groups=numeric_pair_groups,
        one_way_share=one_way_share, numeric_pair_share=numeric_pair_share, pair_round_groups=pair_round_groups,
    )  # fmt: skip


def one_way_rule(one_way_share: OneWayShare) -> OneWayRule | None:
    """The rule a derived share follows (`auto`: its defaults), or None for a declared number."""
    if isinstance(one_way_share, OneWayRule):
        return one_way_share
    if isinstance(one_way_share, str):
        if one_way_share != "auto":
            raise ConfigError(f"aim.one_way_share must be a number in [0, 1), auto or a rule, got {one_way_share!r}")
        return OneWayRule()
    return None


def largest_cells(columns: Sequence[Column], bins: int) -> int:
    """The most cells any column's 1-way marginal has in AIM's domain (writable cells: a schema fact)."""
    return max(int((writable_map(col, bins) >= 0).sum()) for col in columns)


def budget(
    columns: Sequence[Column],
    rho: float,
    rounds: int | None,
    one_way_share: OneWayShare,
    numeric_pair_share: float,
    *,
    bins: int | None = None,
    rows: int | None = None,
) -> AIMBudget:
    """AIM's budget on `columns` (their count and how many are continuous: public schema facts). A derived
    1-way share also reads `bins` and the number of training `rows` (public under replace-one): the same
    plan the fit spends, and the one the accountant's checks see."""
    continuous = sum(1 for col in columns if col.is_continuous)
    t = rounds if rounds is not None else 16 * len(columns)
    rule = one_way_rule(one_way_share)
    if rule is None:
        return AIMBudget(float(rho), len(columns), t, float(one_way_share), numeric_pair_share, continuous)  # type: ignore[arg-type]
    if bins is None or rows is None:
        raise ConfigError("a derived aim.one_way_share needs the cells (bins) and the number of training rows")
    paper = AIMBudget(float(rho), len(columns), t, 0.0, numeric_pair_share, continuous)
    share = derived_one_way_share(paper, rows, largest_cells(columns, bins), rule.noise_fraction, rule.cap)
    return AIMBudget(float(rho), len(columns), t, share, numeric_pair_share, continuous)


def check_budget(
    columns: Sequence[Column], rho: float, rounds: int | None, one_way_share: OneWayShare, numeric_pair_share: float
) -> None:
    """Refuse a budget before the rows are known: a derived share lies between 0 and its cap, so both ends
    are checked (each of AIMBudget's limits holds for every share between them when it holds at both)."""
    rule = one_way_rule(one_way_share)
    shares = [float(one_way_share)] if rule is None else [0.0, rule.cap]  # type: ignore[arg-type]
    for share in shares:
        budget(columns, rho, rounds, share, numeric_pair_share)


def counted_cliques(columns: Sequence[Column], target: str, workload: str, numeric_pair_weight: float) -> list[Clique]:
    """Every clique AIM may measure or score (the workload's downward closure): the counts it reads."""
    names = [c.name for c in columns]
    work = mechanism.workload(len(columns), names.index(target), workload)
    continuous = [j for j, col in enumerate(columns) if col.is_continuous]
    return list(mechanism.candidate_weights(work, mechanism.workload_weights(work, continuous, numeric_pair_weight)))


def fit_counts(
    counts: CellCounts,
    columns: Sequence[Column],
    target: str,
    rho: float,
    noise: mechanism.Noise,
    *,
    bins: int,
    rounds: int | None,
    max_model_mb: float,
    round_iterations: int,
    iterations: int,
    workload: str,
    numeric_pair_weight: float = DEFAULT_NUMERIC_PAIR_WEIGHT,
    numeric_pair_groups: int = DEFAULT_NUMERIC_PAIR_GROUPS,
    one_way_share: OneWayShare = 0.0,
    numeric_pair_share: float = DEFAULT_NUMERIC_PAIR_SHARE,
    pair_round_groups: int = DEFAULT_PAIR_ROUND_GROUPS,
) -> Fitted:
    """`fit` on the training rows' exact cell counts over `counted_cliques` (however they were counted):
    the rows are never read here, and every noise draw follows the complete counts."""
    started = time.perf_counter()
    columns = tuple(columns)
    if counts.total < 1:
        raise ConfigError("AIM needs at least one training row")
    plan = budget(columns, rho, rounds, one_way_share, numeric_pair_share, bins=bins, rows=counts.total)
    maps = [writable_map(col, bins) for col in columns]
    for j, col in enumerate(columns):
        if counts.unmapped_rows((j,), maps):
            raise ConfigError(f"AIM reads complete rows: column {col.name!r} holds missing or undeclared values")
    sizes = [int((m >= 0).sum()) for m in maps]
    names = [c.name for c in columns]
    work = mechanism.workload(len(columns), names.index(target), workload)
    continuous = [j for j, col in enumerate(columns) if col.is_continuous]
    weights = mechanism.workload_weights(work, continuous, numeric_pair_weight)
    answers = {c: counts.mapped(c, maps, sizes).astype(np.float64) for c in mechanism.candidate_weights(work, weights)}
    result = mechanism.run(
        answers,
        counts.total,
        sizes,
        plan,
        work,
        weights,
        noise,
        max_model_mb,
        round_iterations,
        iterations,
        continuous=continuous,
        numeric_pair_groups=numeric_pair_groups,
        pair_round_groups=pair_round_groups,
    )
    tree = result.tree
    cliques, tables, parents = released_cliques(
        tree.graph(), lambda node: tuple(node), lambda node: tree.tables[tree.cliques.index(node)]
    )
    rule = one_way_rule(one_way_share)
    info = {
        "budget": plan.to_dict()
        | ({"one_way_rule": rule.model_dump() | {"largest_cells": largest_cells(columns, bins)}} if rule else {}),
        "rho_spent": result.ledger.spent,
        "workload_cliques": len(work),
        "rounds": [r | {"clique": [names[j] for j in r["clique"]]} for r in result.rounds],
        "pair_rounds": [r | {"clique": [names[j] for j in r["clique"]]} for r in result.pair_rounds],
        "model_cliques": [[names[j] for j in c] for c in cliques],
    }
    model = MSTModel(columns, bins, maps, cliques, tables, parents)
    model.couple()  # the continuous pairs' copula from the model's own tables: post-processing, no row read
    seconds = result.seconds | {"total": time.perf_counter() - started}
    return Fitted(model, info, result.loss, seconds)
