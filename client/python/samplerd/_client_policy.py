"""The job spec's names: the tables of the lower-case names create_job takes for the proto enums,
and Policy, a job's weight policy (proto WeightPolicy)."""

import dataclasses
from typing import Optional

import numpy as np

from . import errors
from ._client_checks import _bad
from ._proto import samplerd_pb2 as pb

_ORDERS = {"weighted_random": pb.WEIGHTED_RANDOM, "sequential": pb.SEQUENTIAL}
_PARTITIONS = {"interleaved": pb.INTERLEAVED, "contiguous": pb.CONTIGUOUS}
_UNEVEN = {"pad": pb.PAD, "drop_last": pb.DROP_LAST, "uneven": pb.UNEVEN}
_BASES = {"uniform": pb.UNIFORM, "static": pb.STATIC, "class_balanced": pb.CLASS_BALANCED}
_LOSSES = {"none": pb.NONE, "loss": pb.LOSS, "multiplicative": pb.MULTIPLICATIVE}
_POLICY_NUMBERS = ("class_balance_beta", "ema_decay", "alpha", "epsilon", "mix", "clamp_lo",
                   "clamp_hi", "prior_loss", "eta")
_POLICY_FLAGS = ("loss_within_groups",)
_POLICY_PARAMS = _POLICY_NUMBERS + _POLICY_FLAGS


@dataclasses.dataclass(frozen=True)
class Policy:
    """A job's weight policy: base weight x loss factor (proto/samplerd.proto WeightPolicy).

    Zero-valued parameters mean the server's defaults (ema_decay 0.9, alpha 1, epsilon 1e-3,
    clamp_lo 0.1, clamp_hi 10, eta 1).

    Attributes:
        base: "uniform", "static" (UploadWeights) or "class_balanced" (UploadLabels).
        loss: "none", "loss" (EMA of the loss, to the power alpha) or "multiplicative".
        class_balance_beta: 0 for 1/count(label); in (0, 1) the effective-number form.
        ema_decay, alpha, epsilon, mix, clamp_lo, clamp_hi, prior_loss: the LOSS policy.
        eta: the MULTIPLICATIVE step size.
        loss_within_groups: LOSS with a "static" or "class_balanced" base: normalise the loss
            factor within each group of equal base weight (each class keeps its class-balanced
            share; docs/SAMPLING.md, "Loss within groups").
    """
    base: str = "uniform"
    loss: str = "none"
    class_balance_beta: float = 0.0
    ema_decay: float = 0.0
    alpha: float = 0.0
    epsilon: float = 0.0
    mix: float = 0.0
    clamp_lo: float = 0.0
    clamp_hi: float = 0.0
    prior_loss: Optional[float] = None
    eta: float = 0.0
    loss_within_groups: bool = False

    def to_proto(self) -> pb.WeightPolicy:
        """The WeightPolicy message. Raises InvalidArgument for an unknown base or loss."""
        params = {}
        for k in _POLICY_FLAGS:
            value = getattr(self, k)
            if not isinstance(value, (bool, np.bool_)):
                raise _bad(f"policy.{k} = {value!r}: expected True or False")
            params[k] = bool(value)
        for k in _POLICY_NUMBERS:
            value = getattr(self, k)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                raise _bad(f"policy.{k} = {value!r}: expected a number")
            params[k] = float(value)
        return pb.WeightPolicy(base=_choice("policy.base", self.base, _BASES),
                               loss=_choice("policy.loss", self.loss, _LOSSES), **params)


def _choice(field, value, table):
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) \
            and value in table.values():
        return int(value)
    try:
        return table[value.lower() if isinstance(value, str) else value]
    except (KeyError, TypeError):
        raise errors.InvalidArgument(
            f"{field} = {value!r}: expected one of {sorted(table)}") from None
