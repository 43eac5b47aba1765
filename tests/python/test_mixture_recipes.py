"""docs/INTEGRATIONS.md's mixture-job recipes run as written against the real samplerd binary
(ADDR its address), and serve what they say: every document or row is read from its domain, in
each domain's share of the window."""

import pathlib
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "INTEGRATIONS.md"


def _snippet(heading):
    text = DOC.read_text()
    section = text[text.index("## Mixture jobs: from a global index to its source"):]
    after = section[section.index(heading):]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def test_the_indexed_corpus_recipe_reads_each_domains_documents(server, client):
    names = {"ADDR": server.address}
    exec(_snippet("### A Megatron-style indexed corpus"), names)
    ds = names["ds"]
    assert ds.group_sizes == [500, 60, 200]
    # The files hold what the reader gives: document d of a domain is its offsets' slice.
    web = names["IndexedTokens"](f"{names['corpus']}/web")
    raw = np.fromfile(f"{names['corpus']}/web.bin", dtype=np.uint16)
    offsets = np.fromfile(f"{names['corpus']}/web.idx", dtype=np.int64)
    assert len(web) == 500 and offsets[0] == 0 and offsets[-1] == len(raw)
    assert web[7].tolist() == raw[offsets[7]:offsets[8]].tolist()
    assert ds[500 + 3].tolist() == names["IndexedTokens"](f"{names['corpus']}/code")[3].tolist()
    # One epoch of 256 served and trained, every loss reported; weights 2 : 1 : 1 are 128, 64
    # and 64 of each window (the 60 code documents and 4 of their next pass).
    summary = names["sampler"].last_summary
    assert summary["accepted"] == 256 and summary["duplicates"] == 0
    # The next window's (epoch 1, served now), read as a second reader would: the same shares.
    window = np.concatenate([c.indices for c in client.stream_shard("mixture-tokens", 1, 0, 1,
                                                                       observe=True)])
    groups, _ = ds.layout.locate(window)
    assert np.bincount(groups, minlength=3).tolist() == [128, 64, 64]
    # The bigram model trained on what was served (the loss of the last batch is finite).
    assert torch.isfinite(names["losses"]).all()


def test_the_hugging_face_recipe_concatenates_in_group_order(server, client):
    pytest.importorskip("datasets", reason="Hugging Face `datasets` is not installed: neither "
                                           "tested environment has it (docs/INTEGRATIONS.md)")
    names = {"ADDR": server.address}
    exec(_snippet("### Hugging Face `datasets`"), names)
    assert (names["k"], names["j"]) == (2, 5)
    ds, merged = names["ds"], names["merged"]
    # Row i of the concatenation is item i of the MixtureDataset, for every i.
    assert [merged[i]["text"] for i in range(len(merged))] == \
        [ds[i]["text"] for i in range(len(ds))]
    assert names["sampler"].last_summary["accepted"] == 120
    window = np.concatenate([c.indices for c in client.stream_shard("mixture-hf", 1, 0, 1,
                                                                       observe=True)])
    assert np.bincount(names["layout"].locate(window)[0], minlength=3).tolist() == [30, 60, 30]
