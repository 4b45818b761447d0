"""The one writer of each calibration kind: every fit returns its part, and the function here that owns
the kind composes and stores the row (through :mod:`scaleplan.db.calibrations`).

'dispatch' is written by :func:`write_dispatch` only. Three fits contribute a part of it: the dispatch
floor from the bench's dispatch rows (``calibrate fit --kind dispatch``: the law's gaps and host time),
the runtime scales from observed step times (``--from-runs``: host_scale, kernel_scale) and the runtime
fit (``--kind runtime``: host_scale on the uncalibrated law). Which law a row's coefficients sit on,
and so which keys of the previous row survive, is decided here once (:func:`dispatch_coefficients`);
how the estimator then stacks a row on the profile and the tables is
:func:`scaleplan.estimator.dispatch.law_in_force`.

'chi_sys' (eq:desync) is written by :func:`write_chi_sys` only: the chi_sys fit and the runtime fit
each hand it their coefficients."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from scaleplan.db import calibrations as store


def law_coefficients(law) -> dict[str, float]:
    """A :class:`~scaleplan.estimator.dispatch.DispatchLaw` written out as calibration coefficients
    (seconds and kernel counts), so a row carries the whole law it was fitted on."""
    return {"t_gap_s": law.t_gap_s, "kappa0": law.kappa0, "kappa1": law.kappa1, "t_host_s": law.t_host_s,
            "t_ep_host_s": law.t_ep_host_s}


def dispatch_coefficients(fitted: dict[str, float], previous: dict[str, Any] | None,
                          base: dict[str, float] | None = None,
                          keep: Callable[[str], bool] = lambda key: False) -> dict[str, float]:
    """The coefficients of a new 'dispatch' row, lowest precedence first: ``base`` (the law the part was
    fitted on, written out), the ``previous`` row's coefficients that ``keep`` accepts (what this fit
    did not refit and stays in force), then ``fitted`` (what this fit set)."""
    kept = {k: v for k, v in (previous or {}).items() if keep(k)}
    return {**(base or {}), **kept, **fitted}


def write_dispatch(sess, profile: str, fitted: dict[str, float], *, base: dict[str, float] | None = None,
                   keep: Callable[[str], bool] = lambda key: False, stack: str = store.PAPER_STACK_KEY,
                   **row) -> Any:
    """Store a new 'dispatch' version of ``profile`` for the training ``stack`` (a Stack.key) composed by
    :func:`dispatch_coefficients` over the newest row in force for that stack; ``row``: inputs, residuals,
    cv_error, n_obs, notes. Returns the stored row."""
    prev = store.newest(sess, profile, "dispatch", stack)
    co = dispatch_coefficients(fitted, dict(prev.coefficients or {}) if prev is not None else None, base, keep)
    return store.store_calibration(sess, profile, "dispatch", co, stack=stack, **row)


def write_chi_sys(sess, profile: str, coefficients: dict[str, float], stack: str = store.PAPER_STACK_KEY,
                  **row) -> Any:
    """Store a new 'chi_sys' version of ``profile`` for ``stack`` (eq:desync coefficients); ``row`` as
    :func:`write_dispatch`. Returns the stored row."""
    return store.store_calibration(sess, profile, "chi_sys", coefficients, stack=stack, **row)


def keys_in(names: Iterable[str]) -> Callable[[str], bool]:
    names = frozenset(names)
    return names.__contains__


def keys_not_in(names: Iterable[str]) -> Callable[[str], bool]:
    names = frozenset(names)
    return lambda key: key not in names
