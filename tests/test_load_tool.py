"""A load generator nobody on this project wrote, run offline against the demo.

Optional: `make load-tool` installs guidellm into its own virtualenv and runs this
with GUIDELLM set; without it the test is skipped. guidellm probes `/health` and
`/v1/models`, builds synthetic prompts with a tokenizer made here
(tests/tools/local_tokenizer.py, nothing downloaded) and streams chat completions.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gateway.ports import free_ports
from tests.support import wait_until
from tests.test_readme import free_run

GUIDELLM = os.environ.get("GUIDELLM", "")
TOKENIZER = Path(__file__).parent / "tools" / "local_tokenizer.py"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}

pytestmark = [
    pytest.mark.load_tool,
    pytest.mark.skipif(
        not (GUIDELLM and Path(GUIDELLM).exists()),
        reason="needs GUIDELLM (a guidellm executable): run `make load-tool`",
    ),
]


def test_guidellm_runs_against_the_demo_with_no_errors(tmp_path: Path) -> None:
    port, workers = free_ports(1)[0], free_run(2)
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "edgeroute.cli",
            "demo",
            "--port",
            str(port),
            "--worker-port",
            str(workers),
            "--workers",
            "2",
            "--speedup",
            "10",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            try:
                return httpx.get(url + "/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, timeout=60)
        python = Path(GUIDELLM).parent / "python"
        subprocess.run([str(python), str(TOKENIZER), str(tmp_path / "tok")], check=True)
        out = tmp_path / "guidellm.json"
        run = subprocess.run(
            [
                GUIDELLM,
                "run",
                "--backend",
                f"kind=openai_http,target={url},model=edge-llm",
                "--profile",
                "kind=concurrent,streams=4",
                "--constraint",
                "kind=max_requests,count=40",
                "--tokenizer",
                f"kind=huggingface_auto,model={tmp_path / 'tok'}",
                "--data",
                "kind=synthetic_text,prompt_tokens=128,output_tokens=32",
                "--output",
                f"kind=json,path={out}",
                "--disable-progress",
            ],
            env={**os.environ, **OFFLINE},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        (bench,) = json.loads(out.read_text())["benchmarks"]
        totals = bench["metrics"]["request_totals"]
        assert (totals["successful"], totals["errored"], totals["incomplete"]) == (40, 0, 0)
    finally:
        os.killpg(demo.pid, signal.SIGKILL)
        demo.wait()
