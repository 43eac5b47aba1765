"""Client's uploads of a job's per-sample values: static weights, class labels."""

import numpy as np

from ._client_checks import _bad, _check_count
from ._client_connection import _Connection
from ._proto import samplerd_pb2 as pb


class _Uploads(_Connection):
    """The client-streaming uploads (UploadWeights, UploadLabels), checked here and counted."""

    def upload_weights(self, job: str, weights, chunk_size: int = 1 << 18) -> int:
        """Uploads the static per-sample weights of a job whose base policy is "static".

        Args:
            job: the job name.
            weights: N values (list, numpy array or CPU tensor), finite, >= 0, not all zero;
                sent as float32.
            chunk_size: values per message.
        Returns:
            The number of weights applied (N).
        Raises:
            InvalidArgument: wrong shape, a NaN/inf/negative weight (named here), wrong count
                or all zero (server).
            FailedPrecondition: the policy is not static, or losses were already reported.
            NotFound, Unavailable.
        """
        w = np.asarray(weights, dtype=np.float64)
        if w.ndim != 1 or w.size == 0:
            raise _bad(f"weights: expected a non-empty 1-D array; got shape {w.shape}")
        w32 = w.astype(np.float32)
        bad = np.flatnonzero(~np.isfinite(w32) | (w32 < 0))
        if bad.size:
            raise _bad(f"weights[{bad[0]}] = {w[bad[0]]}: weights must be finite (as float32) "
                       "and >= 0")
        return self._upload(self._stub.UploadWeights, w32, chunk_size,
                            lambda lo, part: pb.UploadWeightsChunk(job=job, offset=lo,
                                                                   weights=part))

    def upload_labels(self, job: str, labels, chunk_size: int = 1 << 18) -> int:
        """Uploads the per-sample class labels of a job whose base policy is "class_balanced".

        Args:
            job: the job name.
            labels: N integers in [0, 2^32).
            chunk_size: values per message.
        Returns:
            The number of labels applied (N).
        Raises:
            InvalidArgument: wrong shape or type, a label out of range (named here), a count
                other than N (server).
            FailedPrecondition: the policy is not class_balanced.
            NotFound, Unavailable.
        """
        lab = np.asarray(labels)
        if lab.ndim != 1 or lab.size == 0 or lab.dtype.kind not in "iu":
            raise _bad(f"labels: expected a non-empty 1-D integer array; "
                       f"got {lab.dtype} {lab.shape}")
        bad = np.flatnonzero((lab < 0) | (lab > 0xFFFFFFFF))
        if bad.size:
            raise _bad(f"labels[{bad[0]}] = {lab[bad[0]]}: must be in [0, 2^32)")
        return self._upload(self._stub.UploadLabels, lab.astype(np.uint32), chunk_size,
                            lambda lo, part: pb.UploadLabelsChunk(job=job, offset=lo,
                                                                  labels=part))

    def _upload(self, method, values, chunk_size, make_chunk):
        """Streams `values` as chunks of `chunk_size` built by make_chunk(offset, part)."""
        if chunk_size < 1:
            raise _bad(f"chunk_size = {chunk_size}: must be >= 1")

        def chunks():  # A fresh iterator per attempt: a retried upload starts over.
            for lo in range(0, values.size, chunk_size):
                yield make_chunk(lo, values[lo:lo + chunk_size])
        received = self._call(lambda _, timeout: method(chunks(), timeout=timeout), None).received
        _check_count("values", received, values.size)
        return received
