"""scaleplan.estimator: the performance model behind MFU(.) and Mem(.) (paper sec:performance-model).

``Estimator`` loads a profile's measured tables (falling back to analytic models where none are
measured), evaluates execution plans vectorised over numpy arrays, and ranks the realizable plan
set P_disc(N_dev) (app:plan-realization). The contract is :class:`Estimator`'s docstring; where each
piece of the model lives: docs/architecture.md.
"""
from scaleplan.estimator.api import EstimateResult, Estimator, LayoutsResult
from scaleplan.estimator.plans import PlanConstraints

__all__ = ["EstimateResult", "Estimator", "LayoutsResult", "PlanConstraints"]
