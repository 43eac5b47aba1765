"""One DDP trainer rank for the network tests (test_network_paths.py), run as its own process
in the trainers' network namespace: gloo among the ranks on that node's loopback, samplerd at
--address (another node, or a proxy standing for a Kubernetes Service).

Trains --epochs epochs of a tiny DDP model on the sampler's shard in batches of --batch indices,
reporting each batch's per-sample losses. Appends one JSON line per step to --out
({"epoch", "step", "t", "indices"}), flushed, so the test can watch progress; at the end a line
{"done": true, "summary": {...}} with the sampler's loss summary, or {"error": "..."} with the
error that stopped the rank (its message, as a trainer would see it). Before ending each epoch,
a line {"epoch_end", "losses_accepted"}: the server's count of the rank's losses in it
(GetJobStatus). Exit 0 iff done.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "client", "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from samplerd.torch import DistributedWeightedSampler  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--gloo_port", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--client_options", default="{}", help="JSON: samplerd.Client kwargs")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = open(args.out, "a", buffering=1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.gloo_port}",
                            rank=args.rank, world_size=args.world)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    sampler = DistributedWeightedSampler(args.address, args.job, rank=args.rank,
                                         world_size=args.world,
                                         client_options=json.loads(args.client_options))
    try:
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            batch, step = [], 0
            iterator = iter(sampler)
            while True:
                index = next(iterator, None)
                if index is not None:
                    batch.append(index)
                    if len(batch) < args.batch:
                        continue
                if batch:
                    idx = torch.tensor(batch, dtype=torch.int64)
                    features = torch.stack([(idx % k).float() / k for k in (3, 5, 7, 11)], 1)
                    loss = (model(features).squeeze(1) - (idx % 2).float()) ** 2
                    loss.mean().backward()  # All-reduce of the gradients among the ranks.
                    optimizer.step()
                    optimizer.zero_grad()
                    sampler.report(idx, loss.detach())
                    out.write(json.dumps({"epoch": epoch, "step": step, "t": time.time(),
                                          "indices": batch}) + "\n")
                    step += 1
                    batch = []
                if index is None:
                    break
            # The server's count of this rank's losses in the epoch, before the rank ends it
            # (so it is still the current epoch): one per position, retries and all.
            sampler.flush()
            progress = next(p for p in sampler.client.status(args.job).ranks
                            if p.rank == args.rank)
            out.write(json.dumps({"epoch_end": epoch,
                                  "losses_accepted": progress.losses_accepted}) + "\n")
        sampler.close()
        out.write(json.dumps({"done": True, "summary": sampler.last_summary}) + "\n")
    except Exception as e:  # What the trainer would see, for the test to read.
        out.write(json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n")
        os._exit(1)  # Not dist's teardown: the other rank may be gone.
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
