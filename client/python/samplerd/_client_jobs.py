"""Client's job administration: create (from arguments or a JobSpec), rewind, resize, get, list,
delete, status, and the health check."""

import dataclasses
from typing import Dict, List, Optional, Tuple

from . import errors
from ._client_checks import _bad, _unsigned_fields
from ._client_connection import _Connection
from ._client_policy import _ORDERS, _PARTITIONS, _POLICY_PARAMS, _UNEVEN, Policy, _choice
from ._proto import samplerd_pb2 as pb

# MixtureSpec.rule by its lower-case name.
_RULES = {"static": pb.STATIC_WEIGHTS, "excess_loss": pb.EXCESS_LOSS, "exp3": pb.EXP3}
_MIXTURE_KEYS = ("group_sizes", "group_weights", "reference_losses", "rule", "online")


def _mixture_spec(mixture) -> pb.MixtureSpec:
    """A MixtureSpec from a MixtureSpec or a dict {group_sizes, group_weights, reference_losses,
    rule ("static", "excess_loss" or "exp3"), online: {eta, smoothing, ...}} (the server checks
    the values)."""
    if isinstance(mixture, pb.MixtureSpec):
        return mixture
    if not isinstance(mixture, dict):
        raise _bad(f"mixture = {mixture!r}: expected a samplerd_pb2.MixtureSpec or a dict")
    unknown = sorted(set(mixture) - set(_MIXTURE_KEYS))
    if unknown:
        raise _bad(f"mixture: unknown key(s) {unknown}; known: {list(_MIXTURE_KEYS)}")
    online = mixture.get("online") or {}
    if not isinstance(online, dict):
        raise _bad(f"mixture.online = {online!r}: expected a dict")
    fields = pb.OnlineWeights.DESCRIPTOR.fields_by_name
    unknown = sorted(set(online) - set(fields))
    if unknown:
        raise _bad(f"mixture.online: unknown key(s) {unknown}; known: {sorted(fields)}")
    try:
        return pb.MixtureSpec(
            group_sizes=[int(n) for n in mixture.get("group_sizes", ())],
            group_weights=[float(w) for w in mixture.get("group_weights", ())],
            reference_losses=[float(r) for r in mixture.get("reference_losses", ())],
            rule=_choice("mixture.rule", mixture.get("rule", "static"), _RULES),
            online=pb.OnlineWeights(**{k: float(v) for k, v in online.items()}))
    except (TypeError, ValueError) as e:
        raise _bad(f"mixture: {e}") from None


class _Jobs(_Connection):
    """The job RPCs (CreateJob, RewindJob, ResizeJob, SetGroupWeights, GetJob, ListJobs,
    DeleteJob, GetJobStatus) and grpc.health.v1.Health/Check."""

    def create_job(self, name: str, num_samples: int, world_size: int, *, seed: int = 0,
                   samples_per_epoch: int = 0, replacement: bool = False,
                   order="weighted_random", partition="interleaved", uneven="pad",
                   policy: Optional[Policy] = None, base=None, loss=None,
                   resume: bool = False, mixture=None, **policy_params) -> pb.Job:
        """Creates a job (idempotent for an identical spec while the job is in epoch 0).

        The weight policy is given either as `policy=Policy(...)` or flat as `base=`, `loss=`
        and parameter keywords (`loss="loss", alpha=1.0`), not both. Enum-like arguments take
        the lower-case names below (or the proto enum values).

        Args:
            name: [A-Za-z0-9._-]{1,128}, not "." or "..".
            num_samples: N, the dataset size.
            world_size: number of data-parallel ranks.
            seed: seed of the job's random stream.
            samples_per_epoch: M; 0 means N. Without replacement and M == N every sample is
                drawn once per epoch and the weights have no effect.
            replacement: draw with replacement.
            order: "weighted_random" or "sequential".
            partition: "interleaved" or "contiguous".
            uneven: "pad", "drop_last" or "uneven".
            policy: a Policy (or a dict of its fields).
            base: "uniform" (default), "static" or "class_balanced".
            loss: "none" (default), "loss", "multiplicative" or "reducible_loss" (then
                upload_irreducible_losses before the job has a plan).
            resume: continue a job of this name and spec that is past epoch 0 (a restarted
                run). Without it such a job raises FailedPrecondition: a script run again
                must say whether it resumes the job, rewinds it (rewind_job) or replaces it
                (delete_job first).
            mixture: a mixture job (docs/SAMPLING.md, "Mixture jobs"): a pb.MixtureSpec or a
                dict {group_sizes, group_weights, reference_losses, rule ("static",
                "excess_loss" or "exp3"), online: {eta, smoothing, exploration, loss_decay,
                horizon, reward_decay, min_ratio, max_ratio}}. num_samples may then be 0 (the
                sum of the sizes); samples_per_epoch is the window and must be given.
            **policy_params: class_balance_beta, ema_decay, alpha, epsilon, mix, clamp_lo,
                clamp_hi, prior_loss, eta, loss_within_groups (see Policy and the .proto for
                ranges and defaults).
        Returns:
            The job as stored (defaults filled in), in its current epoch.
        Raises:
            InvalidArgument: a bad argument (named), here or on the server.
            AlreadyExists: the name is taken by a job with another spec.
            FailedPrecondition: the job exists past epoch 0 and resume is not set (the
                message names its epoch and the three ways on).
            ResourceExhausted: the server's job, sample or memory limit (--max_memory_bytes).
            Unavailable: the server cannot be reached (after retries).
        """
        unknown = sorted(set(policy_params) - set(_POLICY_PARAMS))
        if unknown:
            raise _bad(f"policy: unknown parameter(s) {unknown}; known: {list(_POLICY_PARAMS)}")
        if policy is not None:
            if base is not None or loss is not None or policy_params:
                raise _bad("policy: give either policy= or base=/loss=/parameters, not both")
            if isinstance(policy, dict):
                fields = {f.name for f in dataclasses.fields(Policy)}
                unknown = sorted(set(policy) - fields)
                if unknown:
                    raise _bad(f"policy: unknown field(s) {unknown}; known: {sorted(fields)}")
                policy = Policy(**policy)
            if not isinstance(policy, Policy):
                raise _bad(f"policy = {policy!r}: expected a samplerd.Policy or a dict")
        else:
            policy = Policy(base=base or "uniform", loss=loss or "none", **policy_params)
        spec = pb.JobSpec(
            **_unsigned_fields(pb.JobSpec, num_samples=num_samples, world_size=world_size,
                               seed=seed, samples_per_epoch=samples_per_epoch),
            replacement=bool(replacement),
            order=_choice("order", order, _ORDERS),
            partition=_choice("partition", partition, _PARTITIONS),
            uneven=_choice("uneven", uneven, _UNEVEN),
            policy=policy.to_proto())
        if mixture is not None:
            spec.mixture.CopyFrom(_mixture_spec(mixture))
        return self.create_job_from_spec(name, spec, resume=resume)

    def set_group_weights(self, job: str, weights) -> pb.Job:
        """Sets the group weights of a mixture job with static weights (rule "static"): one per
        group, finite, >= 0, not all 0 (read as w / sum w). They take effect at the first epoch
        not yet planned: the returned job's current_epoch + 1. Logged and replayed after a
        server restart; a rewind to an earlier epoch's start forgets them.

        Raises:
            InvalidArgument: not one weight per group, or a bad weight (named).
            FailedPrecondition: not a mixture job, or its weights are learned online.
            NotFound, Unavailable.
        """
        try:
            values = [float(w) for w in weights]
        except (TypeError, ValueError):
            raise _bad(f"group_weights = {weights!r}: expected a sequence of numbers") from None
        return self._call(self._stub.SetGroupWeights,
                          pb.SetGroupWeightsRequest(job=job, group_weights=values))

    def group_weight_history(self, job: str) -> List[Tuple[int, Dict[int, float]]]:
        """The group weights in force at each epoch of a mixture job, oldest first (the last
        MAX_WEIGHT_HISTORY epochs; a rewind forgets the epochs after its start): a list of
        (epoch, {group: weight}) of each epoch's MAX_STATUS_GROUPS heaviest groups (all of them
        when K <= MAX_STATUS_GROUPS).

        Raises:
            FailedPrecondition: not a mixture job. NotFound, Unavailable.
        """
        status = self.status(job, weight_history=True)
        if not status.HasField("mixture"):
            raise errors.FailedPrecondition(f"job {job!r} is not a mixture job: no group weights")
        return [(h.epoch, dict(zip(h.groups, h.weights))) for h in status.mixture.history]

    def rewind_job(self, name: str, epoch: int) -> pb.Job:
        """Puts the job back to the start of `epoch` (a run restored from a checkpoint taken
        then): its weights, loss statistics and epoch number then, every rank's progress cleared.
        The epochs after it are planned as the first time. `get_job(name).rewindable_epochs`
        lists the epochs whose start the server keeps (--rewind_epochs).

        Raises:
            FailedPrecondition: the start of `epoch` is not kept (the message names the oldest
                kept), or `epoch` is after the current one.
            NotFound, Unavailable.
        """
        return self._call(self._stub.RewindJob, pb.RewindJobRequest(
            name=name, **_unsigned_fields(pb.RewindJobRequest, epoch=epoch)))

    def resize_job(self, name: str, epoch: int, world_size: int) -> pb.Job:
        """Tells the server the data-parallel group now has `world_size` ranks (torch elastic
        restarted it with fewer or more nodes). Called once, by the new group's first rank,
        before the group reads `epoch` (the job's current epoch). What the current deal of the
        epoch has not done (no loss reported, rank not ended) is dealt to the new ranks; between
        epochs that is the whole plan. The plan itself does not change. A resize to the size the
        epoch has already changes nothing.

        Returns:
            The job, with its new `world_size` and `deal` (what the ranks name from now on in
            stream_shard, report_losses and end_epoch of this epoch).
        Raises:
            InvalidArgument: world_size outside [1, MAX_WORLD_SIZE].
            FailedPrecondition: `epoch` is not the current epoch; the job awaits its upload.
            NotFound, Unavailable.
        """
        return self._call(self._stub.ResizeJob, pb.ResizeJobRequest(
            name=name, **_unsigned_fields(pb.ResizeJobRequest, epoch=epoch,
                                          world_size=world_size)))

    def create_job_from_spec(self, name: str, spec: pb.JobSpec, *, resume: bool = False) -> pb.Job:
        """Creates a job from a JobSpec message as it is (samplerctl's spec files); the server
        checks it. Takes `resume`, returns and raises as create_job."""
        return self._call(self._stub.CreateJob,
                          pb.CreateJobRequest(name=name, spec=spec, resume=bool(resume)))

    def get_job(self, name: str, rank: Optional[int] = None,
                epoch: Optional[int] = None) -> pb.Job:
        """Returns the job's spec (defaults filled in), current epoch, plan readiness, and the
        current epoch's world size and deal.

        Args:
            name: the job name.
            rank: if given, the reply's `shard_length` is this data-parallel rank's shard
                length in the current deal of the current epoch, or with `epoch` in that later
                epoch (the whole plan dealt to the current world size).
            epoch: with rank, the epoch of the shard length.
        Raises:
            NotFound: no job of that name.
            InvalidArgument: rank outside [0, world_size); epoch without rank.
            FailedPrecondition: `epoch` is before the current epoch.
            Unavailable.
        """
        request = pb.GetJobRequest(name=name)
        if rank is not None:
            request.rank = rank
        if epoch is not None:
            request.epoch = epoch
        return self._call(self._stub.GetJob, request)

    def list_jobs(self) -> List[pb.Job]:
        """Returns all jobs, ordered by name.

        Raises:
            Unavailable.
        """
        return list(self._call(self._stub.ListJobs, pb.ListJobsRequest()).jobs)

    def delete_job(self, name: str) -> None:
        """Deletes the job and its state; its open streams end with NOT_FOUND.

        Raises:
            NotFound: no job of that name. Unavailable.
        """
        self._call(self._stub.DeleteJob, pb.DeleteJobRequest(name=name))

    def status(self, name: str, *, weight_history: bool = False) -> pb.JobStatus:
        """Returns the job's status: per-rank progress of the current epoch (indices
        streamed, losses accepted, ended), weight statistics (min, max, mean, effective sample
        size), samples seen, timings and backend; a mixture job's heaviest groups, and with
        `weight_history` the group weights in force at each epoch (mixture.history).

        Raises:
            NotFound: no job of that name. Unavailable.
        """
        return self._call(self._stub.GetJobStatus,
                          pb.GetJobStatusRequest(name=name, weight_history=bool(weight_history)))

    def health(self, service: str = "") -> str:
        """Asks the standard health service (grpc.health.v1.Health/Check) about `service`
        ("" is the whole server, "samplerd.v1.Sampler" the sampler service).

        Returns:
            The serving status name: "SERVING", "NOT_SERVING" (e.g. shutting down) or "UNKNOWN".
        Raises:
            NotFound: the server does not know `service`. Unavailable.
        """
        # Imported here so that the rest of the client works without grpcio-health-checking.
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        response = self._call(health_pb2_grpc.HealthStub(self._channel).Check,
                              health_pb2.HealthCheckRequest(service=service))
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
