"""Logistic-regression model selection of the thesis' downstream experiment (Algorithm 3).

Features arrive already encoded to [-1, 1]; the target is binary {0, 1}. The protocol:

1. `regularisation_grid` draws 20 values of C at random, with a seed, from a logarithmic space strictly
   inside (0, 1); the candidates are penalty (l1, l2) x C, i.e. 40 models.
2. Every candidate is fitted on the training set and scored by ROC AUC on the validation set; the best one
   wins (ties go to the first candidate in candidate order).
3. The winner is refitted on train + validation and scored (ROC AUC and average precision) on the test set.

Two implementations of steps 2-3 are offered by `select_model`:

* ``method="naive"``: the thesis' loop, one scikit-learn ``LogisticRegression(solver="liblinear")`` fit per
  candidate.
* ``method="fast"``: the same objective as liblinear, solved to its optimum along the sorted C path by a
  small dense second-order solver (logistic_path.py: what it solves, how, and how its choice can differ
  from liblinear's).

Degenerate inputs (a collapsed generator that emits a single class in the training or validation set) do
not raise: the result has ``degenerate=True``, ``val_auc=nan``, ``test_auc=0.5`` (a constant score) and
``test_auprc`` equal to the positive rate of the test set (the average precision of a constant score).
A test set with a single class does not raise either: its AUC and average precision are NaN.

Modules: grid.py (the candidates), procedure.py (the selection run, both methods), logistic_path.py (the
fast solver along C), logistic_problem.py (one fit's data and its passes over it), l1_subproblem.py (the
l1 step's quadratic sub-problem). numpy / scipy / scikit-learn and the project's C kernels: no Prefect,
no MLflow.
"""

from dpsynth.models.evaluation.selection.grid import Candidate, regularisation_grid
from dpsynth.models.evaluation.selection.logistic_path import (
    fit_logistic,
    fit_logistic_path,
    liblinear_objective,
)
from dpsynth.models.evaluation.selection.procedure import (
    SelectionResult,
    auc_columns,
    liblinear_model,
    select_model,
)

__all__ = [
    "Candidate",
    "SelectionResult",
    "auc_columns",
    "fit_logistic",
    "fit_logistic_path",
    "liblinear_model",
    "liblinear_objective",
    "regularisation_grid",
    "select_model",
]
