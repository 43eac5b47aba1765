"""The README's PyTorch script runs as written: 2 ranks (it spawns them, gloo) against the real
samplerd, twice (the second run continues the job)."""

import os
import pathlib
import re
import socket
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def readme_script() -> str:
    text = (ROOT / "README.md").read_text()
    after = text[text.index("From PyTorch"):]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def test_the_readme_script_trains_and_a_second_run_continues_the_job(server, client, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(readme_script())
    for run in (1, 2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = dict(os.environ, SAMPLERD_ADDRESS=server.address, MASTER_PORT=str(port),
                   PYTHONPATH=str(ROOT / "client" / "python"), OMP_NUM_THREADS="1")
        result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        for rank in (0, 1):
            for epoch in range(3 * (run - 1), 3 * run):
                assert f"rank {rank} epoch {epoch}:" in result.stdout, result.stdout
        assert client.get_job("train").current_epoch == 3 * run
