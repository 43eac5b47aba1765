"""RestartLog: what a restart costs, made visible -- the positions a restarted rank trains
again or leaves untrained, each counted in DistributedWeightedSampler.restart_summary and said
in a RestartWarning (errors.RestartWarning)."""

import warnings

from . import errors, resume_check


class RestartLog:
    """The counts of restart_summary and the warnings behind them:

    - ended_unreported: positions of epochs the sampler ended without a loss reported (they
      count as done: not dealt again);
    - served_again: positions the sampler served again that the server already had losses for
      when its first iteration began (a restart without load_state_dict);
    - redealt_states: states of another group or deal loaded into an epoch dealt again (what was
      reported after their checkpoint is not replayed);
    - redealt_unacknowledged: the losses such states carried unacknowledged, which are not sent
      into the new deal: the positions of those that never reached the server are dealt again
      and trained again (an upper bound: those that had arrived count as done).
    """

    def __init__(self):
        self.summary = {"ended_unreported": 0, "served_again": 0, "redealt_states": 0,
                        "redealt_unacknowledged": 0}

    def _warn(self, key, count, message, stacklevel):
        """Counts and warns; `stacklevel` as warnings.warn's in the sampler method that calls
        the RestartLog method (this frame and that one are skipped)."""
        self.summary[key] += count
        warnings.warn(message, errors.RestartWarning, stacklevel=stacklevel + 2)

    def served_again(self, status, where: str, rank: int, epoch: int, deal: int,
                     stacklevel: int) -> None:
        """At the first iteration of a sampler that loaded no state (`status`: GetJobStatus):
        makes visible a restart that forgot load_state_dict (the server already has losses of
        this rank in this epoch and deal: those positions are trained again, their losses
        counted as duplicates; the rule: resume_check.served_again, the C++ EpochLoop's too). A
        restart that loaded its state replays the positions after its checkpoint: documented,
        not warned."""
        had = resume_check.served_again(epoch, deal, resume_check.progress_of(status, rank))
        if had == 0:
            return
        self._warn("served_again", had, (
            f"{where}: the server already has {had} losses of this rank in this "
            f"epoch (a previous process's) and this sampler, which loaded no state, starts at "
            f"position 0: the positions it trained are trained again (their losses count once, "
            f"as duplicates). A restarted trainer calls load_state_dict with its checkpoint's "
            f"state before iterating"), stacklevel)

    def redealt(self, loading: str, epoch: int, position: int, saved_world_size: int,
                saved_deal: int, world_size: int, unacknowledged, stacklevel: int) -> None:
        """A state of another group (or deal) loaded into its epoch, dealt again since;
        `unacknowledged`: the losses it carried not yet acknowledged (None if none), which
        cannot be sent into the new deal."""
        carried = ""
        positions = unacknowledged["positions"] if unacknowledged else []
        if len(positions):
            self.summary["redealt_unacknowledged"] += len(positions)
            carried = (
                f" The state carried {len(positions)} losses not yet acknowledged (positions "
                f"{min(positions)} to {max(positions)} of deal {saved_deal}), which are not sent "
                f"into the new deal: the positions of those the server never received are not "
                f"done, so this group is dealt them and trains them again (at most "
                f"{len(positions)}; restart_summary['redealt_unacknowledged'])")
        self._warn("redealt_states", 1, (
            f"{loading}: the state (epoch {epoch}, position {position}) was saved by "
            f"a group of {saved_world_size} ranks (deal {saved_deal}); epoch {epoch} was dealt "
            f"again to this group of {world_size} over the positions not done, so this rank "
            f"starts its new shard. The positions whose losses the previous group reported "
            f"after this checkpoint count as done and are not trained again by the restored "
            f"model (a restart with the same size replays them).{carried}"), stacklevel)

    def ended_unreported(self, where: str, served, length, stacklevel: int) -> None:
        """An epoch was ended with positions of its shard (of `length`, None if unknown) without
        a loss, while the sampler reported some (`served`: its ServedPositions): ending the epoch
        made them count as done, never dealt again. Nothing if it reported none (a trainer that
        reports no losses: nothing to compare with)."""
        reported, _ = served.coverage()
        if reported == 0 or length is None:
            return
        missing = length - served.start - reported
        if missing <= 0:
            return
        self._warn("ended_unreported", missing, (
            f"{where}: ended the epoch with {missing} of the shard's "
            f"positions {served.start} to {length - 1} without a loss reported: they "
            f"count as done and are never dealt again, also after an elastic restart. If this "
            f"rank stops because its group failed (close() in a finally), let the process "
            f"exit without close() so the restarted group trains them"), stacklevel)
