"""A trainer process for test_rank_claims.py: one DistributedWeightedSampler of one rank, driven
by lines on stdin, saying what it did on stdout (one JSON object a line).

    python rank_claim_worker.py ADDRESS JOB RANK WORLD_SIZE SHARED_RANK

It iterates its shard; at the first index (or the first iteration's error) it says
{"started": ...} or {"error": class name, "message": ..., "yielded": 0}. Then each stdin line
"report K" reports the losses (1.0) of the indices yielded up to position K (iterating as far as
needed) and flushes, answering {"reported": K, "summary": last_summary}; "close" closes the
sampler ({"closed": true}); the process then exits.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))

import torch  # noqa: E402

from samplerd.torch import DistributedWeightedSampler  # noqa: E402


def say(**what):
    print(json.dumps(what), flush=True)


def main():
    address, job, rank, world_size, shared = sys.argv[1:6]
    # shared_rank only when set: the same script runs against a client from before it existed
    # (the regression check of test_rank_claims.py).
    peer = {"shared_rank": True} if shared == "1" else {}
    sampler = DistributedWeightedSampler(address, job, rank=int(rank),
                                         world_size=int(world_size), report_batch_size=16,
                                         **peer)
    it = iter(sampler)
    yielded = []
    try:
        yielded.append(next(it))
    except Exception as e:  # The refusal this test looks for, or anything else to show.
        say(error=type(e).__name__, message=str(e), yielded=len(yielded))
        return
    say(started=yielded[0])
    reported = 0
    for line in sys.stdin:
        command = line.split()
        if command[0] == "report":
            upto = int(command[1])
            while len(yielded) < upto:
                yielded.append(next(it))
            sampler.report(torch.tensor(yielded[reported:upto]),
                           torch.ones(upto - reported))
            sampler.flush()
            reported = upto
            say(reported=upto, shard=yielded, summary=sampler.last_summary)
        elif command[0] == "close":
            sampler.close()
            say(closed=True)
            return


if __name__ == "__main__":
    main()
