"""samplerctl: the admin command line of samplerd.

    samplerctl list
    samplerctl status JOB [--watch [--interval S]]
    samplerctl create JOB --spec spec.yaml
    samplerctl delete JOB [--if-exists]
    samplerctl upload-weights JOB weights.npy
    samplerctl upload-labels JOB labels.npy
    samplerctl health
    samplerctl backup DATA_DIR DEST      (on the server's machine: a live, consistent copy)

Every command goes through samplerd.Client (its deadlines, retries and argument checks); this
module only reads local input, formats output and maps errors to exit codes a script can rely
on (EXIT_CODES below, also printed by `samplerctl --help`). Installed as the `samplerctl` entry
point of the samplerd package; also runnable as `python -m samplerd.ctl`.

Adding a command: write a `_cmd_x(ctx, args) -> int` and an `_args_x(parser)`, and add one
Command to COMMANDS.
"""

import argparse
import dataclasses
import datetime
import json
import os
import signal
import sys
import textwrap
import threading
from typing import Callable, Dict, List, Optional, Sequence

import grpc
import numpy as np
import yaml
from google.protobuf import json_format

from . import backup, errors
from .client import Client
from ._proto import samplerd_pb2 as pb

PROG = "samplerctl"
DEFAULT_TARGET = "127.0.0.1:50051"
# The services `health` asks about: the whole server ("") and the sampler service.
HEALTH_SERVICES = ("", pb.DESCRIPTOR.services_by_name["Sampler"].full_name)
# grpc.health.v1's status name for a service the server does not know; Check answers that with
# NOT_FOUND rather than with a status, and `health` reports it as this status.
SERVICE_UNKNOWN = "SERVICE_UNKNOWN"
# Rank rows in a human-readable status; --json lists them all (a job may have 10^6 ranks).
MAX_RANK_ROWS = 64

# -- exit codes -----------------------------------------------------------------------------------
# The one home of the exit-code contract: main() maps errors through it and --help prints it.
EXIT_OK = 0
EXIT_SERVER_ERROR = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_FOUND = 3
EXIT_CONFLICT = 4
EXIT_UNAVAILABLE = 5
EXIT_DENIED = 6
EXIT_NOT_SERVING = 7
EXIT_INTERRUPTED = 130  # The shell's convention for SIGINT.

# gRPC status code -> exit code, grouped by what the caller should do next. Codes not listed
# (INTERNAL, RESOURCE_EXHAUSTED, DATA_LOSS, UNKNOWN, ...) give EXIT_SERVER_ERROR.
_EXIT_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: EXIT_BAD_INPUT,
    grpc.StatusCode.NOT_FOUND: EXIT_NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS: EXIT_CONFLICT,
    grpc.StatusCode.FAILED_PRECONDITION: EXIT_CONFLICT,
    grpc.StatusCode.UNAVAILABLE: EXIT_UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: EXIT_UNAVAILABLE,
    grpc.StatusCode.UNAUTHENTICATED: EXIT_DENIED,
    grpc.StatusCode.PERMISSION_DENIED: EXIT_DENIED,
}
EXIT_CODES = {
    EXIT_OK: "ok (also: status --watch stopped with Ctrl-C; delete --if-exists of no job)",
    EXIT_SERVER_ERROR: "the server answered an error not listed below (INTERNAL, "
                       "RESOURCE_EXHAUSTED, DATA_LOSS, ...)",
    EXIT_BAD_INPUT: "bad input: a usage error, a missing or malformed file (spec, .npy, "
                    "certificate; the message names it), or the server's",
    EXIT_NOT_FOUND: "no such job",
    EXIT_CONFLICT: "the job's state forbids it (another spec under that name, epoch not open, "
                   "wrong policy for the upload)",
    EXIT_UNAVAILABLE: "cannot reach the server (after the client's retries), or the TLS "
                      "handshake failed (server certificate not trusted, client certificate "
                      "missing or refused: gRPC reports these as UNAVAILABLE; the message says "
                      "which)",
    EXIT_DENIED: "the server refused the call: no or bad bearer token, or not allowed",
    EXIT_NOT_SERVING: "health: the server answered, but not SERVING for every service",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C), except status --watch",
}


class InputError(Exception):
    """Bad local input (a file that is missing or malformed): exit 2, naming the file."""

    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}")
        self.path = path


# -- output helpers -------------------------------------------------------------------------------

def message_to_dict(message, *, defaults: bool = True) -> dict:
    """The proto3 JSON mapping of `message` with the .proto's field names (64-bit integers are
    strings there), so that a job's spec from `status --json` can be fed back to `create`."""
    if not defaults:
        return json_format.MessageToDict(message, preserving_proto_field_name=True)
    try:
        return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                         always_print_fields_with_no_presence=True)
    except TypeError:  # protobuf < 5.26 (Debian 12 has 4.21) names the option differently.
        return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                         including_default_value_fields=True)


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Plain columns: the first left-aligned, the others right-aligned."""
    cells = [list(map(str, headers))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        parts = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _enum(enum_type, value: int) -> str:
    return enum_type.Name(value) if value in enum_type.values() else str(value)


def _policy_text(policy: pb.WeightPolicy, with_parameters: bool = True) -> str:
    """"UNIFORM x LOSS (alpha=1, mix=0.1, ...)": the parameters that are not 0 (a stored job
    has the defaults filled in)."""
    params = message_to_dict(policy, defaults=False)
    params.pop("base", None)
    params.pop("loss", None)
    text = f"{_enum(pb.BasePolicy, policy.base)} x {_enum(pb.LossPolicy, policy.loss)}"
    if params and with_parameters:
        text += " (" + ", ".join(f"{k}={v:g}" for k, v in params.items()) + ")"
    return text


def _format_jobs(jobs: Sequence[pb.Job]) -> str:
    if not jobs:
        return "no jobs"
    rows = [(j.name, j.current_epoch, "ready" if j.plan_ready else "waiting",
             j.spec.num_samples, j.spec.samples_per_epoch, j.spec.world_size,
             _policy_text(j.spec.policy, with_parameters=False)) for j in jobs]
    return _table(("NAME", "EPOCH", "PLAN", "N", "M", "WORLD", "POLICY"), rows)


def _format_job(job: pb.Job) -> str:
    s = job.spec
    return "\n".join([
        f"job {job.name}: epoch {job.current_epoch}, plan "
        f"{'ready' if job.plan_ready else 'waiting (uploads or planning)'}",
        f"  spec    N {s.num_samples}  M {s.samples_per_epoch}  world {s.world_size}  "
        f"seed {s.seed}  {'with' if s.replacement else 'without'} replacement  "
        f"{_enum(pb.Order, s.order)}  {_enum(pb.Partition, s.partition)}  "
        f"{_enum(pb.UnevenPolicy, s.uneven)}",
        f"  dealt   to {job.world_size} ranks (deal {job.deal} of epoch {job.current_epoch})",
        f"  policy  {_policy_text(s.policy)}",
        "  rewindable epochs  " + (", ".join(str(e) for e in job.rewindable_epochs) or "none"),
    ])


def _format_status(status: pb.JobStatus) -> str:
    w = status.weights
    n = status.job.spec.num_samples
    ended = sum(1 for r in status.ranks if r.ended)
    weights = (
        f"  weights min {w.min:g}  max {w.max:g}  mean {w.mean:g}  ESS "
        f"{w.effective_sample_size:.6g} ({100.0 * w.effective_sample_size / max(n, 1):.1f}% "
        f"of N)  zeros {w.zero_count}" if status.HasField("weights") else
        f"  weights -  (epoch {status.job.current_epoch} has no plan yet)")
    lines = [
        _format_job(status.job),
        weights,
        f"  losses  samples seen {status.samples_seen}  last recompute "
        f"{status.last_recompute_ms:.3g} ms  last plan {status.last_plan_ms:.3g} ms  "
        f"backend {status.backend or '-'}",
        f"  ranks   {ended}/{len(status.ranks)} ended epoch {status.job.current_epoch}"
        + (" (planning it: no rank has started it)" if status.planning else ""),
        "",
    ]
    rows = [(r.rank, r.indices_streamed, r.losses_accepted, "yes" if r.ended else "no")
            for r in status.ranks[:MAX_RANK_ROWS]]
    lines.append(_table(("RANK", "STREAMED", "LOSSES", "ENDED"), rows))
    if len(status.ranks) > MAX_RANK_ROWS:
        lines.append(f"... {len(status.ranks) - MAX_RANK_ROWS} more ranks (--json lists all)")
    if status.HasField("mixture"):
        mix = status.mixture
        lines += ["", f"  mixture  {mix.groups} groups; the {len(mix.top_groups)} heaviest:"]
        # `pass` is a Python keyword: the field is read by name. No window served (the epoch
        # is being planned or awaits an upload): the window's fields are unset, shown as "-".
        served = status.job.plan_ready
        rows = [(g.group, f"{g.weight:.6g}", *((g.window_count, getattr(g, "pass"), g.position)
                                               if served else ("-", "-", "-")))
                for g in mix.top_groups]
        lines.append(_table(("GROUP", "WEIGHT", "WINDOW", "PASS", "POSITION"), rows))
    return "\n".join(lines)


# -- local input ----------------------------------------------------------------------------------

def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise InputError(path, f"cannot read: {e.strerror or e}") from None


def read_spec(path: str) -> pb.JobSpec:
    """A JobSpec from a YAML or JSON file (.json: JSON) whose keys are the JobSpec fields.

    Parsed by protobuf's json_format, so an unknown field, a wrong type or an enum name that
    does not exist is an InputError naming the field; values are then checked by the server.
    """
    text = _read_bytes(path)
    is_json = path.endswith(".json")
    try:
        data = json.loads(text) if is_json else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise InputError(path, f"not valid {'JSON' if is_json else 'YAML'}: {e}") from None
    if not isinstance(data, dict):
        raise InputError(path, "expected a mapping of JobSpec fields (num_samples, world_size, "
                               f"policy, ...); got {type(data).__name__}")
    try:
        return json_format.ParseDict(data, pb.JobSpec())
    except json_format.ParseError as e:
        raise InputError(path, f"not a valid JobSpec: {e}") from None


def read_npy(path: str, what: str, kinds: str, expected: str) -> np.ndarray:
    """A non-empty 1-D array from a .npy file whose dtype kind is one of `kinds`.

    Raises:
        InputError: naming the file, and its shape and dtype when those are wrong.
    """
    try:
        array = np.load(path, allow_pickle=False)  # Never unpickle: a .npy is data, not code.
    except OSError as e:
        raise InputError(path, f"cannot read: {e.strerror or e}") from None
    except (ValueError, EOFError) as e:
        raise InputError(path, f"not a .npy array: {e}") from None
    if not isinstance(array, np.ndarray):  # An .npz archive loads as a dict of arrays.
        raise InputError(path, "not a .npy array (an .npz archive?): save one array with "
                               "numpy.save")
    if array.ndim != 1 or array.size == 0 or array.dtype.kind not in kinds:
        raise InputError(path, f"shape {array.shape} dtype {array.dtype}: {what} needs a "
                               f"non-empty 1-D array of {expected}")
    return array


def connection_options(args: argparse.Namespace) -> Dict[str, object]:
    """Client keyword arguments for the TLS and token options that were given (only those, so
    that a plaintext call needs nothing more of the client than its address)."""
    options = {}
    for name, path in (("root_certificates", args.ca), ("client_cert", args.cert),
                       ("client_key", args.key)):
        if path:
            options[name] = _read_bytes(path)
    if args.token:
        options["token"] = args.token
    return options


# -- commands -------------------------------------------------------------------------------------

class Context:
    """What a command needs: the parsed options, the client (connected on first use, after
    the command has read its local input) and the output."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self._client: Optional[Client] = None

    @property
    def client(self) -> Client:
        if self._client is None:
            # An operator's command answers within a second when samplerd is down, rather than
            # wait out the 300 s a trainer's client rides through restarts with.
            self._client = Client(self.args.target, timeout=self.args.timeout, max_retries=3,
                                  **connection_options(self.args))
        return self._client

    def emit(self, document, text: str):
        """Prints the result: `document` as one JSON document with --json, else `text`."""
        print(json.dumps(document) if self.args.json else text, flush=True)

    def close(self):
        if self._client is not None:
            self._client.close()


def _args_none(parser):
    del parser


def _args_job(parser):
    parser.add_argument("job", metavar="JOB", help="job name")


def _cmd_list(ctx, args):
    del args
    jobs = ctx.client.list_jobs()
    ctx.emit({"jobs": [message_to_dict(j) for j in jobs]}, _format_jobs(jobs))
    return EXIT_OK


def _args_status(parser):
    _args_job(parser)
    parser.add_argument("--watch", action="store_true",
                        help="refresh until Ctrl-C (exit 0) or until the job is deleted "
                             "(exit 3); with --json one JSON document per line per refresh")
    parser.add_argument("--interval", type=_positive_float, default=1.0, metavar="S",
                        help="seconds between refreshes with --watch (default: 1)")


def _cmd_status(ctx, args):
    if not args.watch:
        status = ctx.client.status(args.job)
        ctx.emit(message_to_dict(status), _format_status(status))
        return EXIT_OK
    clear = sys.stdout.isatty() and not args.json
    # Ctrl-C is the way to stop watching, not a failure. It only sets a flag: a
    # KeyboardInterrupt raised inside a gRPC call could leave the channel's locks held, and
    # closing the client would then hang.
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        while not stop.is_set():
            status = ctx.client.status(args.job)  # NOT_FOUND once deleted: exit 3.
            if args.json:
                ctx.emit(message_to_dict(status), "")
            else:
                header = (f"Every {args.interval:g} s: {PROG} status {args.job}    "
                          f"{datetime.datetime.now():%Y-%m-%d %H:%M:%S}    (Ctrl-C to stop)")
                print(("\033[H\033[2J" if clear else "\n") + header + "\n\n" +
                      _format_status(status), flush=True)
            stop.wait(args.interval)
    finally:
        signal.signal(signal.SIGINT, previous)
    return EXIT_OK


def _args_create(parser):
    _args_job(parser)
    parser.add_argument("--spec", required=True, metavar="FILE",
                        help="YAML or JSON (.json) file of JobSpec fields as in "
                             "proto/samplerd.proto, e.g. {num_samples: 1000, world_size: 4, "
                             "samples_per_epoch: 250, policy: {loss: LOSS, alpha: 1}}; enum "
                             "values by their .proto names")
    parser.add_argument("--resume", action="store_true",
                        help="a job of this name and spec past epoch 0 is returned as it is "
                             "(without: exit 4, the job is at epoch E: resume, rewind or delete)")


def _cmd_create(ctx, args):
    spec = read_spec(args.spec)
    job = ctx.client.create_job_from_spec(args.job, spec, resume=args.resume)
    ctx.emit(message_to_dict(job), _format_job(job))
    return EXIT_OK


def _args_delete(parser):
    _args_job(parser)
    parser.add_argument("--if-exists", action="store_true",
                        help="a job that does not exist is not an error (exit 0)")


def _cmd_delete(ctx, args):
    try:
        ctx.client.delete_job(args.job)
        existed = True
    except errors.NotFound:
        if not args.if_exists:
            raise
        existed = False
    ctx.emit({"job": args.job, "deleted": existed},
             f"deleted job {args.job}" if existed else f"no job {args.job}: nothing to delete")
    return EXIT_OK


def _args_rewind(parser):
    _args_job(parser)
    parser.add_argument("epoch", type=int, help="an epoch whose start the server keeps "
                                               "(status: rewindable epochs)")


def _cmd_rewind(ctx, args):
    job = ctx.client.rewind_job(args.job, args.epoch)
    ctx.emit(message_to_dict(job), _format_job(job))
    return EXIT_OK


def _args_resize(parser):
    _args_job(parser)
    parser.add_argument("epoch", type=int, help="the job's current epoch (a guard)")
    parser.add_argument("world_size", type=int, help="the group's new number of "
                                                    "data-parallel ranks")


def _cmd_resize(ctx, args):
    job = ctx.client.resize_job(args.job, args.epoch, args.world_size)
    ctx.emit(message_to_dict(job), _format_job(job))
    return EXIT_OK


def _args_backup(parser):
    parser.add_argument("data_dir", metavar="DATA_DIR", help="the server's --data_dir")
    parser.add_argument("destination", metavar="DEST", help="a new directory for the copy")


def _cmd_backup(ctx, args):
    try:
        summary = backup.backup_data_dir(args.data_dir, args.destination)
    except backup.BackupError as e:
        raise InputError(e.path, e.reason) from None
    frozen = (f"samplerd (pid {summary.server_pid}) paused {summary.frozen_ms:.0f} ms"
              if summary.server_pid is not None else "no samplerd was running")
    ctx.emit({"destination": args.destination, **dataclasses.asdict(summary)},
             f"backed up {summary.jobs} job(s), {summary.files} files "
             f"({summary.copied_bytes} bytes copied, {summary.linked_bytes} hard-linked) to "
             f"{args.destination}; {frozen}")
    return EXIT_OK


def _args_upload(parser):
    _args_job(parser)
    parser.add_argument("file", metavar="FILE.npy", help="a 1-D array saved with numpy.save")


def _upload(ctx, args, method, what, kinds, expected):
    values = read_npy(args.file, what, kinds, expected)
    try:
        received = method(args.job, values)
    except errors.InvalidArgument as e:  # A bad value (the client's check) or count (server).
        raise errors.InvalidArgument(f"{args.file}: {e.message}", e.code) from None
    ctx.emit({"job": args.job, "file": args.file, "received": received},
             f"uploaded {received} {what} from {args.file} to job {args.job}")
    return EXIT_OK


def _cmd_upload_weights(ctx, args):
    return _upload(ctx, args, ctx.client.upload_weights, "weights", "fiu",
                   "real numbers (a float or integer dtype)")


def _cmd_upload_labels(ctx, args):
    return _upload(ctx, args, ctx.client.upload_labels, "labels", "iu",
                   "class labels (an integer dtype)")


def _cmd_health(ctx, args):
    del args
    statuses = {}
    for service in HEALTH_SERVICES:
        try:
            statuses[service] = ctx.client.health(service)
        except errors.NotFound:  # The health service's answer for a service it does not know.
            statuses[service] = SERVICE_UNKNOWN
    serving = all(s == "SERVING" for s in statuses.values())
    text = "\n".join(f"{service or '(server)':<24}{status}" for service, status in statuses.items())
    ctx.emit({"target": ctx.args.target, "serving": serving, "services": statuses}, text)
    return EXIT_OK if serving else EXIT_NOT_SERVING


def _args_weights(parser):
    _args_job(parser)
    parser.add_argument("--set", type=float, nargs="+", metavar="W",
                        help="a static mixture job's new group weights, one per group (in "
                             "force from the next epoch; SetGroupWeights)")
    parser.add_argument("--last", type=int, default=20, metavar="N",
                        help="epochs shown in the table (default: 20; --json lists all kept)")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="also draw the weight history of the current heaviest groups "
                             "(needs matplotlib)")


def _format_weights(job: str, status: pb.JobStatus, last: int) -> str:
    mix = status.mixture
    history = list(mix.history)
    lines = [f"job {job}: {mix.groups} groups, rule {_enum(pb.GroupWeightRule, mix.rule)}; "
             f"weights in force at epoch {status.job.current_epoch}:",
             _table(("GROUP", "WEIGHT"), [(g.group, f"{g.weight:.6g}") for g in mix.top_groups])]
    if history:
        # The current heaviest groups' weights over the last epochs ("-": not among that
        # epoch's heaviest).
        groups = [g.group for g in mix.top_groups]
        rows = []
        for h in history[-max(last, 1):]:
            of = dict(zip(h.groups, h.weights))
            rows.append((h.epoch, *(f"{of[g]:.4g}" if g in of else "-" for g in groups)))
        lines += ["", f"history (the last {len(rows)} of {len(history)} epochs kept):",
                  _table(("EPOCH", *(f"g{g}" for g in groups)), rows)]
    return "\n".join(lines)


def _plot_weights(status: pb.JobStatus, path: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for g in (t.group for t in status.mixture.top_groups):
        points = [(h.epoch, dict(zip(h.groups, h.weights)).get(g, float("nan")))
                  for h in status.mixture.history]
        ax.plot([e for e, _ in points], [w for _, w in points], marker=".", label=f"group {g}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("group weight in force")
    ax.set_title(f"{status.job.name}: {_enum(pb.GroupWeightRule, status.mixture.rule)}")
    ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _cmd_weights(ctx, args):
    if args.set is not None:
        job = ctx.client.set_group_weights(args.job, args.set)
        print(f"job {args.job}: group weights set, in force from epoch {job.current_epoch + 1}",
              file=sys.stderr if args.json else sys.stdout, flush=True)
    status = ctx.client.status(args.job, weight_history=True)
    if not status.HasField("mixture"):
        raise errors.FailedPrecondition(f"job {args.job!r} is not a mixture job: no group weights")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(f"{PROG} weights --plot needs matplotlib, which is not importable here "
                  f"(pip install matplotlib); nothing drawn", file=sys.stderr, flush=True)
            return EXIT_BAD_INPUT
        _plot_weights(status, args.plot)
    ctx.emit(message_to_dict(status.mixture), _format_weights(args.job, status, args.last))
    return EXIT_OK


@dataclasses.dataclass(frozen=True)
class Command:
    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[Context, argparse.Namespace], int]


COMMANDS = (
    Command("list", "list the jobs", _args_none, _cmd_list),
    Command("status", "a job's epoch, plan, per-rank progress and weight statistics",
            _args_status, _cmd_status),
    Command("create", "create a job from a spec file (idempotent for the same spec)",
            _args_create, _cmd_create),
    Command("delete", "delete a job and its state (asks nothing)", _args_delete, _cmd_delete),
    Command("rewind", "put a job back to the start of a kept epoch (a restored checkpoint's)",
            _args_rewind, _cmd_rewind),
    Command("resize", "deal the current epoch's rest to a group of another size (elastic)",
            _args_resize, _cmd_resize),
    Command("weights", "a mixture job's group weights: in force now and their history "
                       "(--set: new static weights; --plot: a chart)", _args_weights,
            _cmd_weights),
    Command("upload-weights", "upload a STATIC job's per-sample weights from a .npy file",
            _args_upload, _cmd_upload_weights),
    Command("upload-labels", "upload a CLASS_BALANCED job's per-sample labels from a .npy file",
            _args_upload, _cmd_upload_labels),
    Command("health", f"exit 0 only if grpc.health.v1 answers SERVING for the server and "
                      f"{HEALTH_SERVICES[1]}", _args_none, _cmd_health),
    Command("backup", "copy a running server's --data_dir consistently (run on its machine, "
                      "as its user; the server pauses while the logs are copied; restore: "
                      "docs/PERSISTENCE.md)", _args_backup, _cmd_backup),
)


# -- parser ---------------------------------------------------------------------------------------

def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number > 0")
    return value


def _add_global_options(parser: argparse.ArgumentParser, with_defaults: bool):
    """The options every command takes. Added to the main parser (with the defaults) and to
    each command's (without, so that `samplerctl list --json` works as `samplerctl --json list`
    and a command's parser does not reset what was given before the command)."""
    def default(value):
        return value if with_defaults else argparse.SUPPRESS
    env = os.environ.get
    group = parser.add_argument_group("global options")
    group.add_argument("--target", default=default(env("SAMPLERD_TARGET", DEFAULT_TARGET)),
                       metavar="HOST:PORT",
                       help=f"the server (env SAMPLERD_TARGET; default {DEFAULT_TARGET})")
    group.add_argument("--timeout", type=_positive_float, default=default(10.0), metavar="S",
                       help="deadline of each call in seconds (default: 10)")
    group.add_argument("--json", action="store_true", default=default(False),
                       help="print one JSON document on stdout (errors too, as {\"error\": "
                            "...}); messages use the proto3 JSON mapping with the .proto's "
                            "field names (64-bit integers are strings)")
    group.add_argument("--ca", default=default(env("SAMPLERD_CA")), metavar="FILE",
                       help="PEM CA certificate(s) to verify the server: TLS (env SAMPLERD_CA)")
    group.add_argument("--cert", default=default(env("SAMPLERD_CLIENT_CERT")), metavar="FILE",
                       help="PEM client certificate for mutual TLS (env SAMPLERD_CLIENT_CERT)")
    group.add_argument("--key", default=default(env("SAMPLERD_CLIENT_KEY")), metavar="FILE",
                       help="PEM key of --cert (env SAMPLERD_CLIENT_KEY)")
    group.add_argument("--token", default=default(env("SAMPLERD_TOKEN")), metavar="TOKEN",
                       help="bearer token (env SAMPLERD_TOKEN; the environment keeps it out "
                            "of the process list)")


def exit_code_help() -> str:
    """The exit-code table, from EXIT_CODES and _EXIT_BY_CODE."""
    lines = ["exit codes:"]
    for exit_code, meaning in EXIT_CODES.items():
        codes = [c.name for c, e in _EXIT_BY_CODE.items() if e == exit_code]
        text = f"{exit_code:>3}  {meaning}" + (f": {', '.join(codes)}" if codes else "")
        lines.append(textwrap.fill(text, width=94, initial_indent="  ", subsequent_indent=" " * 7))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Administer a samplerd server.",
        epilog=exit_code_help() + f"\n\nErrors print '{PROG}: CODE: message' (a gRPC code) or "
               f"'{PROG}: FILE: message' on stderr.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_global_options(parser, with_defaults=True)
    commands = parser.add_subparsers(dest="command_name", metavar="COMMAND", required=True)
    for command in COMMANDS:
        sub = commands.add_parser(command.name, help=command.help, description=command.help)
        command.arguments(sub)
        _add_global_options(sub, with_defaults=False)
        sub.set_defaults(command=command)
    return parser


def _exit_code_of(code: grpc.StatusCode) -> int:
    return _EXIT_BY_CODE.get(code, EXIT_SERVER_ERROR)


def main(argv: Optional[List[str]] = None) -> int:
    """Runs samplerctl with `argv` (default: sys.argv[1:]); returns the exit code."""
    args = build_parser().parse_args(argv)  # Usage errors exit 2 here (argparse).
    ctx = Context(args)

    def fail(exit_code, code_name, message, **extra):
        print(f"{PROG}: {message}" if code_name is None else f"{PROG}: {code_name}: {message}",
              file=sys.stderr, flush=True)
        if args.json:
            print(json.dumps({"error": {"code": code_name, "message": message,
                                        "exit_code": exit_code, **extra}}), flush=True)
        return exit_code

    try:
        return args.command.run(ctx, args)
    except InputError as e:
        return fail(EXIT_BAD_INPUT, None, str(e), file=e.path)
    except errors.SamplerError as e:
        message = e.message
        if _exit_code_of(e.code) == EXIT_UNAVAILABLE:
            message += f" (target {args.target})"
        return fail(_exit_code_of(e.code), e.code.name, message)
    except KeyboardInterrupt:
        return fail(EXIT_INTERRUPTED, None, "interrupted")
    except BrokenPipeError:
        # The reader went away (`samplerctl list | head`): not an error of the command. Point
        # stdout at devnull so that the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    finally:
        ctx.close()


if __name__ == "__main__":
    sys.exit(main())
