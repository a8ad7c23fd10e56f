"""Being told, for real: `rlhf notify URL` on a Prefect server, then a pipeline whose health
detector fires and one that fails; a local HTTP receiver gets both messages through Prefect's
automations and its webhook block."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.flows.prefect_procs import ROOT, prefect_server
from tests.shared import PREF, write_config

# a detector that fires at once: any rollout takes more than 0.1% of an iteration's time
FIRES = ["ppo.iterations=3", "ppo.health.slow_rollout.window=1",
         "ppo.health.slow_rollout.max_share=0.001"]


class Receiver:
    """A webhook on 127.0.0.1: keeps every JSON body POSTed to it."""

    def __init__(self):
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                received.append(json.loads(body or b"{}"))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, words: tuple[str, ...], timeout: float = 180) -> dict:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for message in self.received:
                text = json.dumps(message)
                if all(w in text for w in words):
                    return message
            time.sleep(1)
        raise TimeoutError(f"no message with {words} in {self.received}")


def _rlhf(env: dict, cwd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=900)


def test_a_health_finding_and_a_failed_run_reach_the_webhook(tmp_path, tiny_model_dir):
    receiver = Receiver()
    try:
        with prefect_server(tmp_path / "server") as (api, env):
            env = {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
            out = _rlhf(env, tmp_path, "notify", receiver.url)
            assert out.returncode == 0, out.stderr
            assert "rlhf: PPO unhealthy, rlhf: run failed" in out.stdout
            config = ROOT / "configs" / "test.yaml"
            sets = [a for item in FIRES for a in ("--set", item)]
            run = _rlhf(env, tmp_path, "run", "--config", str(config), *sets)
            assert run.returncode == 0, run.stderr[-3000:]
            told = receiver.wait_for(("generation dominates", "slow_rollout", "Advice"))
            assert told["subject"] == "rlhf: PPO generation dominates (warn)"
            assert "MLflow parent run" in told["text"]
            (tmp_path / "bad").mkdir()
            bad = write_config(tmp_path / "bad", tiny_model_dir,
                               pref=[{**PREF[0], "rejected": PREF[0]["chosen"]}, PREF[1]])
            failed = _rlhf(env, tmp_path, "run", "--config", str(bad))
            assert failed.returncode != 0
            told = receiver.wait_for(("rlhf_pipeline run", "Failed"))
            assert "chosen == rejected" in told["text"]
            off = _rlhf(env, tmp_path, "notify", "--off")
            assert "removed: rlhf: PPO unhealthy, rlhf: run failed" in off.stdout
    finally:
        receiver.server.shutdown()


def test_notify_needs_a_prefect_server(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(tmp_path)
    out = _rlhf(env, tmp_path, "notify", "http://127.0.0.1:9/hook")
    assert out.returncode == 2
    assert "PREFECT_API_URL is not set" in out.stderr
