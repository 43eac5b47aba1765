"""Which group weights train a byte-level language model best on a mixture of real text domains
plus one unlearnable domain (random bytes)?

Every arm is a samplerd mixture job (JobSpec.mixture: one group per domain, in the order of
bench/text_mixture_data.py) served by the real samplerd binary, read by 2 real DDP ranks (gloo,
CPU, one thread each) through DistributedWeightedSampler + IndexedDataset, each sample's loss
(its mean byte cross-entropy) reported with sampler.report. Every arm of a seed starts from the
same model and trains for the same number of epochs (windows of `window` chunks), so the same
token budget. Rank 0 evaluates every domain's held-out loss every `eval_every` epochs and reads
the weights in force each epoch from GetJobStatus (mixture.top_groups).

Arms (run in this order for each seed; the paired seeds share the model's initialisation):
  uniform   uniform over domains (every group weight 1). Runs first: its final held-out losses
            are the reference losses of `excess` and set `hand`'s weights (DoReMi's recipe:
            the reference model is trained on the uniform mixture).
  prop      proportional to the domains' sizes (group_weights empty): every chunk equally likely
  hand      a static mixture tuned by hand from the uniform run: each text domain's weight is
            its final held-out loss under `uniform` (the harder a domain, the more of it), the
            random bytes HAND_RANDOM_SHARE of the total (a user who looked at the data knows
            they are noise)
  excess    samplerd's online EXCESS_LOSS rule (DoReMi's exponentiated gradient on each group's
            excess loss over its reference, with the stall floor), from uniform weights
  exp3      samplerd's online EXP3 rule (Online Data Mixing's bandit, rewarded by each group's
            loss decrease), from uniform weights
The online arms use the server's defaults (OnlineWeights unset) unless --online sets fields;
they are skipped, with the reason printed, against a server or client without online weights.

The model: a causal convolutional byte LM (embedding 32, four dilated convolutions of 64
channels, kernel 3, dilations 1-2-4-8, residual; 68k parameters) predicting bytes 1..63 of each
64-byte chunk from their prefix; Adam.

    .venv/bin/python bench/text_mixture_benchmark.py --plot text.png --json text.json
    .venv/bin/python bench/text_mixture_benchmark.py --smoke           # seconds: every arm runs
    .venv/bin/python bench/text_mixture_benchmark.py --report text.json --plot text.png

(--samplerd, or $SAMPLERD_BIN, names the binary: `bazel build //server:samplerd`.)
"""

import argparse
import json
import os
import platform
import signal
import sys
import tempfile
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "client", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
sys.path.insert(0, HERE)
import samplerd  # noqa: E402
from ddp_demo import start_samplerd  # noqa: E402
from ddp_train import free_port, spawn_ranks  # noqa: E402
from samplerd._proto import samplerd_pb2 as pb  # noqa: E402
from samplerd.torch import DistributedWeightedSampler, IndexedDataset  # noqa: E402
import text_mixture_data as tdata  # noqa: E402
import text_mixture_report as treport  # noqa: E402

ARMS = ("uniform", "prop", "hand", "excess", "exp3")
STATIC_ARMS = ("uniform", "prop", "hand")
ONLINE_RULES = {"excess": "EXCESS_LOSS", "exp3": "EXP3"}
HAND_RANDOM_SHARE = 0.02
PRESETS = {
    # 36 windows of 256 chunks: 288 steps of 16 chunks per rank, 18,432 chunks (1.16 M
    # predicted bytes) a run.
    "full": dict(seeds=3, epochs=36, window=256, batch_size=16, world=2, lr=3e-3,
                 eval_every=4, scale=1.0),
    "smoke": dict(seeds=1, epochs=4, window=64, batch_size=8, world=2, lr=3e-3,
                  eval_every=2, scale=0.05),
}


class ByteConvLM(torch.nn.Module):
    """Causal dilated convolutions over byte embeddings; logits of the next byte."""

    def __init__(self, emb=32, channels=64, dilations=(1, 2, 4, 8), kernel=3):
        super().__init__()
        self.emb = torch.nn.Embedding(256, emb)
        self.dilations, self.kernel = dilations, kernel
        self.convs = torch.nn.ModuleList(
            torch.nn.Conv1d(emb if i == 0 else channels, channels, kernel, dilation=d)
            for i, d in enumerate(dilations))
        self.out = torch.nn.Linear(channels, 256)

    def forward(self, x):  # x: int64 [batch, T] -> logits [batch, T, 256]
        h = self.emb(x).transpose(1, 2)
        for i, (conv, d) in enumerate(zip(self.convs, self.dilations)):
            y = torch.relu(conv(F.pad(h, ((self.kernel - 1) * d, 0))))
            h = y + h if i > 0 else y
        return self.out(h.transpose(1, 2))


def chunk_losses(model, chunks):
    """Mean cross-entropy (nats per byte) of bytes 1..T-1 of each chunk given its prefix."""
    logits = model(chunks[:, :-1])
    return F.cross_entropy(logits.reshape(-1, 256), chunks[:, 1:].reshape(-1),
                           reduction="none").view(len(chunks), -1).mean(dim=1)


def make_model(seed):
    torch.manual_seed(seed)
    return ByteConvLM()


def evaluate(model, held):
    """{domain: held-out loss} of the model."""
    with torch.no_grad():
        return {name: float(chunk_losses(model, chunks).mean()) for name, chunks in held.items()}


def mixture_spec(arm, sizes, names, seed, window, world, reference=None, online=None):
    """The JobSpec of an arm (reference: {domain: loss} of the uniform run)."""
    k = len(sizes)
    mix = pb.MixtureSpec(group_sizes=sizes)
    if arm in ("uniform", "excess", "exp3"):
        mix.group_weights.extend([1.0] * k)
    elif arm == "hand":
        mix.group_weights.extend(hand_weights(names, reference))
    if arm in ONLINE_RULES:
        mix.rule = pb.GroupWeightRule.Value(ONLINE_RULES[arm])
        for field, value in (online or {}).items():
            setattr(mix.online, field, float(value))
        mix.online.SetInParent()
        if arm == "excess":
            mix.reference_losses.extend([reference[n] for n in names])
    return pb.JobSpec(world_size=world, seed=seed, samples_per_epoch=window, mixture=mix)


def hand_weights(names, reference):
    """`hand`: text domains by their uniform-run loss, random bytes HAND_RANDOM_SHARE."""
    text = [n for n in names if n != "random"]
    total = sum(reference[n] for n in text)
    w = []
    for n in names:
        if n == "random":
            w.append(HAND_RANDOM_SHARE)
        else:
            w.append((1.0 - (HAND_RANDOM_SHARE if "random" in names else 0.0))
                     * reference[n] / total)
    return w


def online_support(address):
    """None if this client and server serve online group weights, else why not."""
    fields = pb.MixtureSpec.DESCRIPTOR.fields_by_name
    if "rule" not in fields or "online" not in fields:
        return "this client's MixtureSpec has no rule/online fields (online weights, issue 35)"
    probe = "text-mixture-probe"
    spec = pb.JobSpec(world_size=1, samples_per_epoch=2, mixture=pb.MixtureSpec(
        group_sizes=[2, 2], group_weights=[1, 1], rule=pb.GroupWeightRule.Value("EXP3")))
    try:
        with samplerd.Client(address) as c:
            c.create_job_from_spec(probe, spec)
            stored = c.get_job(probe).spec.mixture
            c.delete_job(probe)
    except Exception as e:  # noqa: BLE001 -- any refusal means the arm cannot run here.
        return f"the server refused an EXP3 mixture job: {type(e).__name__}: " \
               f"{str(e).splitlines()[0][:200]}"
    if stored.rule != spec.mixture.rule:
        return "the server dropped MixtureSpec.rule (it predates online weights)"
    return None


def train_arm(cfg, arm, seed, rank, world, train, held, offsets, names, reference):
    """One arm, one seed. Returns (curve [[step, {domain: loss}]], weights per epoch
    [{domain: weight}] (rank 0), drawn chunks per epoch and group [[count]])."""
    job = f"text-{arm}-{seed}"
    if rank == 0:
        spec = mixture_spec(arm, [int(offsets[i + 1] - offsets[i]) for i in range(len(names))],
                            names, seed, cfg["window"], world, reference, cfg["online"])
        with samplerd.Client(cfg["address"]) as c:
            c.create_job_from_spec(job, spec)
    dist.barrier()
    model = DDP(make_model(seed))
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    sampler = DistributedWeightedSampler(cfg["address"], job, rank, world, report_batch_size=64)
    loader = torch.utils.data.DataLoader(IndexedDataset(torch.utils.data.TensorDataset(train)),
                                         sampler=sampler, batch_size=cfg["batch_size"])
    status = samplerd.Client(cfg["address"]) if rank == 0 else None
    curve, weights, drawn, step = [], [], [], 0
    try:
        for epoch in range(cfg["epochs"]):
            sampler.set_epoch(epoch)
            counts = np.zeros(len(names), np.int64)
            for i, (idx, (x,)) in enumerate(loader):
                if status is not None and i == 0:  # The plan is ready: its weights are in force.
                    w = {g.group: g.weight for g in status.status(job).mixture.top_groups}
                    weights.append({n: w.get(k, 0.0) for k, n in enumerate(names)})
                np.add.at(counts, np.searchsorted(offsets, idx.numpy(), side="right") - 1, 1)
                loss = chunk_losses(model, x.long())
                sampler.report(idx, loss.detach())
                opt.zero_grad()
                loss.mean().backward()
                opt.step()
                step += 1
            drawn.append(counts.tolist())
            if rank == 0 and ((epoch + 1) % cfg["eval_every"] == 0 or epoch + 1 == cfg["epochs"]):
                curve.append([step, evaluate(model.module, held)])
    finally:
        sampler.close()
        if status is not None:
            status.close()
    dist.barrier()
    if rank == 0:
        with samplerd.Client(cfg["address"]) as c:
            c.delete_job(job)
    return curve, weights, drawn


def worker(rank, world, cfg):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg["master_port"])
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", samplerd.RestartWarning)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        domains = tdata.load(tdata.CAP_SETS[cfg["caps"]], cfg["scale"])
        names = [d.name for d in domains]
        train = torch.from_numpy(np.concatenate([d.train for d in domains]))
        offsets = np.cumsum([0] + [len(d.train) for d in domains])
        held = {d.name: torch.from_numpy(d.held).long() for d in domains}
        results = []
        for seed in range(cfg["seeds"]):
            reference = None
            for arm in cfg["arms"]:
                kept = cfg["previous"].get(str(seed), {}).get(arm)
                if kept is not None:  # A run of an earlier invocation (--reuse): not run again.
                    if arm == "uniform":
                        reference = kept["curve"][-1][1]
                    if rank == 0:
                        results.append(kept)
                    continue
                t0 = time.time()
                curve, weights, drawn = train_arm(cfg, arm, seed, rank, world, train, held,
                                                  offsets, names, reference)
                gathered = [None] * world
                dist.all_gather_object(gathered, drawn)
                if arm == "uniform":  # The reference of the later arms of this seed.
                    box = [curve[-1][1] if rank == 0 else None]
                    dist.broadcast_object_list(box, src=0)
                    reference = box[0]
                if rank != 0:
                    continue
                results.append({
                    "seed": seed, "arm": arm, "curve": curve, "weights": weights,
                    "drawn": np.sum(gathered, axis=0).tolist(), "reference": reference,
                    "seconds": time.time() - t0})
                if cfg["partial"]:
                    with open(cfg["partial"], "a") as f:
                        f.write(json.dumps(results[-1]) + "\n")
                if cfg["verbose"]:
                    final = curve[-1][1]
                    learn = [final[n] for n in names if n != "random"]
                    print(f"seed {seed} {arm:<8} mean learnable {np.mean(learn):.3f} worst "
                          f"{max(learn):.3f} random {final.get('random', float('nan')):.3f} "
                          f"({time.time() - t0:.0f} s)", flush=True)
        if rank == 0:
            with open(cfg["report"], "w") as f:
                json.dump({"domains": tdata.describe(domains), "results": results}, f)
    finally:
        dist.destroy_process_group()


def run(binary, *, seeds, epochs, window, batch_size, world, lr, eval_every, scale,
        arms=ARMS, caps="headers_large", online=None, verbose=True, partial="", previous=()):
    """Runs the benchmark on a fresh samplerd. Returns ({domain: sizes}, per-run results,
    {arm: why skipped}). `previous`: runs of an earlier invocation with the same settings,
    kept as they are (not run again; its uniform runs are the references)."""
    if "uniform" in arms and arms[0] != "uniform":
        arms = ("uniform",) + tuple(a for a in arms if a != "uniform")
    if any(a in ("hand", "excess") for a in arms) and "uniform" not in arms:
        raise ValueError("the hand and excess arms need the uniform arm (their reference)")
    proc, address = start_samplerd(binary)
    try:
        skipped = {}
        if any(a in ONLINE_RULES for a in arms):
            why = online_support(address)
            if why:
                skipped = {a: why for a in arms if a in ONLINE_RULES}
        for arm, why in skipped.items():
            print(f"text_mixture: skipping arm {arm}: {why}", flush=True)
        cfg = {"address": address, "arms": [a for a in arms if a not in skipped],
               "seeds": seeds, "epochs": epochs, "window": window, "batch_size": batch_size,
               "lr": lr, "eval_every": eval_every, "scale": scale, "caps": caps,
               "online": dict(online or {}), "verbose": verbose, "partial": partial,
               "previous": {},
               "master_port": free_port()}
        for r in previous:
            if r["arm"] in cfg["arms"] and r["seed"] < seeds:
                cfg["previous"].setdefault(str(r["seed"]), {})[r["arm"]] = r
        with tempfile.TemporaryDirectory() as tmp:
            out = spawn_ranks(worker, world, cfg, os.path.join(tmp, "results.json"))
        return out["domains"], out["results"], skipped
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samplerd",
                        default=os.environ.get("SAMPLERD_BIN", "bazel-bin/server/samplerd"))
    mode = parser.add_mutually_exclusive_group()
    for name in PRESETS:
        mode.add_argument(f"--{name}", dest="preset", action="store_const", const=name,
                          help=f"preset: {PRESETS[name]}")
    parser.set_defaults(preset="full")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {ARMS}")
    for key in ("seeds", "epochs", "window", "batch_size", "world", "eval_every"):
        parser.add_argument(f"--{key}", type=int, help="overrides the preset")
    for key in ("lr", "scale"):
        parser.add_argument(f"--{key}", type=float, help="overrides the preset")
    parser.add_argument("--caps", default="headers_large", choices=sorted(tdata.CAP_SETS),
                        help="the domains' sizes (bench/text_mixture_data.py)")
    parser.add_argument("--online", default="{}",
                        help='OnlineWeights fields of the online arms as JSON, e.g. '
                             '\'{"eta": 1, "min_ratio": 0.1}\' (default: the server\'s)')
    parser.add_argument("--json", default="", help="also write the per-run results here")
    parser.add_argument("--plot", default="", help="write the curves and weights here (PNG)")
    parser.add_argument("--reuse", default="",
                        help="a --json file of an earlier run with the same settings: its runs "
                             "are kept, not run again (e.g. the static arms, before the online "
                             "ones)")
    parser.add_argument("--baseline", default="prop",
                        help="the arm the paired differences are taken from (and the target)")
    parser.add_argument("--report", default="",
                        help="run nothing: print the tables (and --plot) of a --json file")
    args = parser.parse_args()
    if args.report:
        with open(args.report) as f:
            stored = json.load(f)
        table = treport.summarise(stored["results"], baseline=args.baseline)
        if args.plot:
            treport.plot(stored["results"], table, args.plot)
        print(f"{args.report}: {stored['config']}; domains {stored['domains']}")
        for arm, why in stored["skipped"].items():
            print(f"skipped {arm}: {why}")
        print(treport.markdown(table))
        return
    if not os.access(args.samplerd, os.X_OK):
        sys.exit(f"samplerd binary not found at {args.samplerd}: `bazel build //server:samplerd`")
    cfg = dict(PRESETS[args.preset])
    for key in ("seeds", "epochs", "window", "batch_size", "world", "eval_every", "lr",
                "scale"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    arms = tuple(args.arms.split(","))
    unknown = [a for a in arms if a not in ARMS]
    if unknown or args.baseline not in arms:
        sys.exit(f"--arms: {unknown or f'the baseline {args.baseline} is missing'}: the arms "
                 f"are {','.join(ARMS)}")
    online = json.loads(args.online)
    cfg["caps"] = args.caps
    previous = []
    if args.reuse:
        with open(args.reuse) as f:
            stored = json.load(f)
        theirs = dict({"caps": "headers_large"}, **stored["config"])
        differ = {k: (v, cfg.get(k)) for k, v in theirs.items()
                  if k not in ("online", "seeds") and cfg.get(k) != v}
        if differ:
            sys.exit(f"--reuse {args.reuse}: its settings differ (theirs, these): {differ}")
        previous = stored["results"]
    t0 = time.time()
    domains, results, skipped = run(args.samplerd, arms=arms, online=online,
                                    partial=args.json + ".partial" if args.json else "",
                                    previous=previous, **cfg)
    config = dict(cfg, online=online)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": config, "domains": domains, "skipped": skipped,
                       "results": results}, f)
    table = treport.summarise(results, baseline=args.baseline)
    if args.plot:
        treport.plot(results, table, args.plot)
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, torch {torch.__version__}; "
          f"preset {args.preset} {config}; {time.time() - t0:.0f} s")
    print(f"domains (training chunks of {tdata.CHUNK} bytes): {domains}")
    for arm, why in skipped.items():
        print(f"skipped {arm}: {why}")
    print(treport.markdown(table))


if __name__ == "__main__":
    main()
