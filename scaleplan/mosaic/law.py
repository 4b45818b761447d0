"""The sparse-MoE scaling laws (sec:scaling-law-design).

Joint law (eq:joint-law), in raw counts (N_tot in parameters, D in tokens, S a fraction, G = d_ff/d_expert):

    L(N_tot, S, D, G) = a / N_tot^alpha + b / D^beta + c / (1-S)^lambda
                        + j / ((1-S)^delta * N_tot^gamma * G^eta) + e

Per-G law (eq:abnar-law) is the same form without the G factor (eta = 0), fitted per G stratum.
The built-in default is the paper's fit (tab:joint-law-coeffs); the per-G default for a stratum G is
the joint law restricted to that G (j_G = j / G^eta), since the paper does not print per-G coefficients.

Convention check: with N_tot, S of q=12, E=96, K=2, G=4 (scaleplan.geometry: N_tot 327.2e9, S 0.9556)
and D = 1.42e12 tokens the default law gives 1.3896 (tab:pareto-B prints 1.3898 at D rounded).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from scaleplan.errors import SpecError

#: Coefficient names in the order of tab:joint-law-coeffs (JSON keys; ``lambda`` spelled out).
NAMES = ("a", "b", "c", "j", "e", "alpha", "beta", "lambda", "delta", "gamma", "eta")
PREFACTORS = ("a", "b", "c", "j", "e")
EXPONENTS = ("alpha", "beta", "lambda", "delta", "gamma", "eta")


@dataclass(frozen=True)
class JointLaw:
    """Coefficients of eq:joint-law (``lam`` is lambda). Prefactors are positive; losses in nats."""

    a: float
    b: float
    c: float
    j: float
    e: float
    alpha: float
    beta: float
    lam: float
    delta: float
    gamma: float
    eta: float

    def __call__(self, n_tot, s, d, g=1.0):
        """Predicted loss (nats/token); arrays broadcast.

        n_tot: non-embedding total parameters; s: sparsity 1 - N_act/N_tot in [0, 1); d: training tokens;
        g: expert split factor. Returns a float or an ndarray of the broadcast shape.
        """
        n_tot, s, d, g = (np.asarray(x, dtype=float) for x in (n_tot, s, d, g))
        r = 1.0 - s
        out = (self.a * n_tot ** -self.alpha + self.b * d ** -self.beta + self.c * r ** -self.lam
               + self.j * r ** -self.delta * n_tot ** -self.gamma * g ** -self.eta + self.e)
        return float(out) if out.ndim == 0 else out

    def terms(self, n_tot, s, d, g=1.0) -> dict[str, float]:
        """The five additive terms (capacity, data, sparsity floor, interaction, irreducible)."""
        r = 1.0 - s
        return {"capacity": self.a * n_tot ** -self.alpha, "data": self.b * d ** -self.beta,
                "sparsity": self.c * r ** -self.lam,
                "interaction": self.j * r ** -self.delta * n_tot ** -self.gamma * g ** -self.eta,
                "irreducible": self.e}

    def to_dict(self) -> dict[str, float]:
        """JSON form with the paper's names (``lambda`` rather than ``lam``)."""
        d = asdict(self)
        d["lambda"] = d.pop("lam")
        return {k: float(d[k]) for k in NAMES}

    @classmethod
    def from_dict(cls, d: dict) -> JointLaw:
        """Build from a dict keyed by NAMES (``lambda`` or ``lam``); ``eta`` defaults to 0 (per-G form).

        Raises SpecError on a missing or non-positive prefactor.
        """
        d = dict(d)
        if "lambda" in d:
            d["lam"] = d.pop("lambda")
        d.setdefault("eta", 0.0)
        missing = [k for k in ("a", "b", "c", "j", "e", "alpha", "beta", "lam", "delta", "gamma") if k not in d]
        if missing:
            raise SpecError("law.coefficients", sorted(d), f"all of {list(NAMES)} (missing {missing})")
        for k in PREFACTORS:
            if not float(d[k]) > 0:
                raise SpecError(f"law.coefficients.{k}", d[k], "a positive prefactor")
        return cls(**{k: float(d[k]) for k in ("a", "b", "c", "j", "e", "alpha", "beta", "lam", "delta", "gamma",
                                              "eta")})

    def vector(self) -> np.ndarray:
        """Coefficients as an array in NAMES order."""
        return np.array([self.to_dict()[k] for k in NAMES])

    def per_g(self, g: float) -> JointLaw:
        """The per-G law (eq:abnar-law) this joint law implies at split factor g (eta folded into j)."""
        return replace(self, j=self.j * float(g) ** -self.eta, eta=0.0)


#: tab:joint-law-coeffs, the deployed joint law (the built-in default).
PAPER_JOINT_LAW = JointLaw(a=8.462, b=88.32, c=0.1828, j=0.7123, e=0.3129, alpha=0.1048, beta=0.2070,
                           lam=0.1249, delta=0.5567, gamma=0.1702, eta=0.9513)

#: tab:joint-law-coeffs 95% BCa intervals and identifiability, for reference output.
PAPER_CI95 = {"a": (8.24, 8.85), "b": (87.8, 89.9), "c": (0.181, 0.184), "j": (0.710, 0.713),
              "e": (0.307, 0.316), "alpha": (0.104, 0.106), "beta": (0.206, 0.208), "lambda": (0.119, 0.138),
              "delta": (0.550, 0.577), "gamma": (0.167, 0.174), "eta": (0.911, 0.954)}
PAPER_IDENTIFIED = ("beta", "eta")


@dataclass(frozen=True)
class LawSupport:
    """The region of the law's training data: sparsity S and tokens per active parameter TPP = D/N_act.

    A candidate outside it is an extrapolation of the law on that axis (flagged ``extrapolated``).
    """

    s_min: float
    s_max: float
    tpp_min: float
    tpp_max: float

    def axes(self, s: float, tpp: float) -> list[str]:
        """Which axes ("S", "TPP") a point lies beyond the support on; [] inside it."""
        out = []
        if not self.s_min <= s <= self.s_max:
            out.append("S")
        if not self.tpp_min <= tpp <= self.tpp_max:
            out.append("TPP")
        return out

    def to_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}

    @classmethod
    def of_runs(cls, s, tpp) -> LawSupport:
        """The support spanned by training runs (arrays of S and D/N_act)."""
        s, tpp = np.asarray(s, dtype=float), np.asarray(tpp, dtype=float)
        return cls(float(s.min()), float(s.max()), float(tpp.min()), float(tpp.max()))


#: The paper's data support (tab:dataset-headline): S from 0.499, TPP 10.8..70. The upper S edge is the
#: paper's S_max = 0.985 (fig:mosaic-motivation, sec:boundary-optimum: "the upper boundary of our data
#: support"); its dataset table prints 0.981 as the largest run's S.
PAPER_SUPPORT = LawSupport(s_min=0.499, s_max=0.985, tpp_min=10.8, tpp_max=70.0)
#: sec:joint-NtSDG-law: held-out RMSE of the joint law (loss units)
PAPER_RMSE = 0.00779


def per_g_law(g: float, joint: JointLaw = PAPER_JOINT_LAW) -> JointLaw:
    """Default per-G law (eq:abnar-law) for stratum g: the joint law at that g."""
    return joint.per_g(g)


@dataclass(frozen=True)
class LoadedLaw:
    """A law with what its uncertainty and extrapolation flags need.

    ``ridge``: stored ridge samples of a fit (rows in NAMES order; None for the paper's law, whose samples
    are drawn by :mod:`scaleplan.mosaic.ridge`); ``support``: its data support.
    """

    law: JointLaw
    source: str
    support: LawSupport
    ridge: np.ndarray | None = None
    scatter: float = PAPER_RMSE  # held-out RMSE (loss units): a fit's own, else the paper's


def load_law(db_url: str | None = None, name: str | None = None) -> tuple[JointLaw, str]:
    """The law to use: the newest stored LawFit named ``name`` (or any), else the paper's default.

    Returns (law, source) where source is "paper" or "db:<fit id>". ``db_url=None`` means the paper's law
    (the search never silently picks up a fit from a default database).
    """
    got = load_law_full(db_url, name)
    return got.law, got.source


def load_law_full(db_url: str | None = None, name: str | None = None) -> LoadedLaw:
    """As :func:`load_law`, with the fit's data support and ridge samples (``settings`` of the LawFit row).

    A fit stored before supports were recorded gets the paper's support. Raises SpecError on an unknown name.
    """
    paper = LoadedLaw(PAPER_JOINT_LAW, "paper", PAPER_SUPPORT)
    if db_url is None:
        return paper
    from sqlalchemy import inspect, select

    from scaleplan.db.models import LawFit
    from scaleplan.db.session import get_engine, session_scope

    if not inspect(get_engine(db_url)).has_table("law_fit"):
        return paper
    with session_scope(db_url) as s:
        q = select(LawFit).order_by(LawFit.id.desc())
        if name:
            q = q.where(LawFit.name == name)
        row = s.execute(q.limit(1)).scalar_one_or_none()
        if row is None:
            if name:
                raise SpecError("--law", name, "the name of a stored fit (`scaleplan law fit --name`)")
            return paper
        settings = row.settings or {}
        sup = settings.get("support")
        ridge = settings.get("ridge_samples")
        return LoadedLaw(JointLaw.from_dict(row.coefficients), f"db:{row.id}",
                         LawSupport(**sup) if sup else PAPER_SUPPORT,
                         np.array([[float(r[k]) for k in NAMES] for r in ridge]) if ridge else None,
                         float(row.heldout_rmse) if row.heldout_rmse else PAPER_RMSE)
