"""A third-party plugin package, installed into this environment, routes live traffic
with no file of the gateway touched (examples/edgeroute-pinned)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from policies import default_registry
from tests.support import GatewayProcess, WorkerProcess

PACKAGE = Path(__file__).resolve().parents[2] / "examples" / "edgeroute-pinned"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The package installed into a directory of this module's own, put on the path of
    this process and (through the environment returned) of the gateways it starts.

    Not into the virtualenv: xdist runs this module's tests in several processes at
    once, and one process's uninstall pulled the package from under another's gateway,
    which then never became ready."""
    root = tmp_path_factory.mktemp("plugin")
    # Built from a copy: a build leaves build/ and *.egg-info beside the sources.
    source = root / PACKAGE.name
    shutil.copytree(PACKAGE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    site = root / "site"
    install = ["install", "--no-deps", "--no-build-isolation", "--no-index", "--target", str(site)]
    subprocess.run(
        [*PIP, *install, str(source)],
        check=True,
        capture_output=True,
    )
    sys.path.insert(0, str(site))
    default_registry.cache_clear()  # this process read the entry points before
    try:
        yield {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
        }
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("edgeroute_pinned", None)
        default_registry.cache_clear()


def post(url: str, body: dict[str, object]) -> httpx.Response:
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=10)
    r.raise_for_status()
    return r


def test_an_installed_scorer_policy_and_hook_are_chosen_in_yaml_and_act(
    installed: dict[str, str], tmp_path: Path
) -> None:
    names = ("--served-model-name", "instant", "--served-model-name", "other")
    workers = [WorkerProcess("--profile", "instant", *names) for _ in range(3)]
    config = tmp_path / "gateway.yaml"
    outcomes = tmp_path / "outcomes.jsonl"
    config.write_text(
        yaml.safe_dump(
            {
                "backends": [{"id": f"w{i}", "url": w.url} for i, w in enumerate(workers)],
                "hooks": [{"type": "outcome_log", "params": {"path": str(outcomes)}}],
                "routing": {
                    # The installed scorer, with parameters, in a built-in preset.
                    "default": {
                        "policy": "least_load",
                        "scorers": [
                            {"type": "pinned", "weight": 1.0, "params": {"backends": ["w2"]}}
                        ],
                    },
                    # The installed whole policy, for one model.
                    "models": {
                        "other": {"policy": "pinned_only", "params": {"backends": ["w1", "w0"]}}
                    },
                },
            }
        )
    )
    gateway = GatewayProcess(config, {"EDGEROUTE_ADMIN_TOKEN": "plugin-token", **installed})
    try:
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
        picked: Counter[str] = Counter()
        for i in range(12):
            raw = client.chat.completions.with_raw_response.create(
                model="instant",
                messages=[{"role": "user", "content": f"a prompt long enough to hash, {i}"}],
                max_tokens=2,
            )
            picked[raw.headers["x-edgeroute-backend"]] += 1
        # least_load alone spreads over the three; the pinned scorer sends all to w2.
        assert picked == {"w2": 12}
        # The installed hook saw each of those requests end, on the backend that served it.
        logged = [json.loads(line) for line in outcomes.read_text().splitlines()]
        assert [(e["backend"], e["status"]) for e in logged] == [("w2", "200")] * 12
        assert all(e["tokens"] > 0 for e in logged)
        # The whole policy: the first pinned backend that can serve.
        other: dict[str, object] = {
            "model": "other",
            "messages": [{"role": "user", "content": "hi"}],
        }
        admin = {"authorization": "Bearer plugin-token"}
        chosen = {post(gateway.url, other).headers["x-edgeroute-backend"] for _ in range(4)}
        assert chosen == {"w1"}
        httpx.post(gateway.url + "/admin/backends/w1/drain", headers=admin).raise_for_status()
        chosen = {post(gateway.url, other).headers["x-edgeroute-backend"] for _ in range(4)}
        assert chosen == {"w0"}
        httpx.post(gateway.url + "/admin/backends/w0/drain", headers=admin).raise_for_status()
        refused = httpx.post(gateway.url + "/v1/chat/completions", json=other)
        assert refused.status_code == 503 and "pinned" in refused.json()["error"]["message"]
    finally:
        gateway.kill()
        for w in workers:
            w.kill()


def test_a_plugin_given_bad_parameters_is_refused_with_its_own_message(
    installed: dict[str, str],
) -> None:
    from policies import PipelineSpec, PluginError, Registry, build_policy
    from policies.builtin import register_builtins

    registry = Registry()
    register_builtins(registry)
    registry.load_entry_points()
    spec = PipelineSpec(policy="least_load", scorers=[{"type": "pinned", "params": {"x": 1}}])  # type: ignore[list-item]
    with pytest.raises(PluginError, match=r"scorer 'pinned'.*unknown parameters \['x'\]"):
        build_policy(spec, registry)


def test_an_unknown_hook_is_refused_by_name(installed: dict[str, str]) -> None:
    from gateway.hooks import make_hook
    from policies import PluginError

    with pytest.raises(PluginError, match=r"unknown hook 'no_such_hook'"):
        make_hook("no_such_hook", {})
    with pytest.raises(PluginError, match=r"hook 'outcome_log'.*unknown parameters"):
        make_hook("outcome_log", {"path": "x", "mode": "w"})
