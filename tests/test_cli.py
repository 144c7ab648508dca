import subprocess
import sys


def run(*args):
    return subprocess.run(
        [sys.executable, "-m", "speceyes_graph.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_example_prints_every_route(tmp_path):
    r = run("example", "--dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    lines = {
        line.split()[0]: line.split()
        for line in r.stdout.splitlines()
        if line.startswith(("big-", "tiny-"))
    }
    assert lines["big-red"][1] == "speculative" and lines["tiny-blue"][1] == "judged-agentic"
    assert lines["tiny-yellow"][1] == "rejected-agentic"
    assert all(
        row[3] == "yes" for row in lines.values()
    )  # every answer right (the agent read the crops)
    assert "SCRIPTED" in r.stdout


def run_here(capsys, *args):
    """(exit code, stdout) of the CLI run in this process: the same ``main`` as the
    ``speceyes`` entry point, without a Python start per call."""
    from speceyes_graph.cli import main

    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse's --help and errors
        code = exc.code
    return code, capsys.readouterr().out


def test_graph_drawing(tmp_path, capsys):
    code, out = run_here(capsys, "graph", "--format", "mermaid")
    assert code == 0 and "subgraph agent_loop" in out and "judge" in out
    code, out = run_here(capsys, "graph", "--format", "ascii")
    assert code == 0 and "speculate" in out and "tools" in out
    png = tmp_path / "g.png"
    r = run("graph", "--format", "png", "-o", str(png))  # one as users start it
    assert r.returncode == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, out = run_here(capsys, "graph", "--format", "mermaid", "--mode", "agent")
    assert "speculate" not in out and "agent_loop" in out


def test_workflow_edges_are_labelled():
    from speceyes_graph.cli.graph import _placeholder_graph
    from speceyes_graph.graph.drawing import to_dot

    g = _placeholder_graph("speceyes", "deepeyes").compile().get_graph(xray=True)
    labels = {(e.source, e.target): e.data for e in g.edges}
    assert labels[("judge", "speculate")] == "no"
    assert labels[("judge", "agent_loop:__start__")] == "yes"
    assert labels[("gate", "__end__")] == "accept"
    assert labels[("gate", "agent_loop:__start__")] == "reject"
    assert labels[("agent_loop:agent", "agent_loop:tools")] == "tool call"
    dot = to_dot(g)
    for word in ("yes", "no", "accept", "reject", "tool call"):
        assert f'label=" {word} "' in dot


def test_png_without_graphviz(monkeypatch):
    import shutil

    from speceyes_graph.cli.graph import _placeholder_graph
    from speceyes_graph.graph.drawing import draw

    monkeypatch.setattr(shutil, "which", lambda name: None)
    png = draw(_placeholder_graph("speceyes", "deepeyes"), "png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000


def test_make_tiny_models(tmp_path):
    r = run("make-tiny-models", str(tmp_path / "m"))
    assert r.returncode == 0, r.stderr
    assert "small:" in r.stdout and "large:" in r.stdout
    assert (tmp_path / "m" / "small" / "config.json").exists()
    assert (tmp_path / "m" / "large" / "model.safetensors").exists()


def test_train_demo_smoke(tmp_path):
    """Two steps of training write a checkpoint that loads through the ordinary path."""
    r = run(
        "train-demo", str(tmp_path / "t"), "--models", "small", "--steps", "2", "--threads", "1"
    )
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    from speceyes_graph.models import ChatTransformersVLM

    history = json.loads((tmp_path / "t" / "small" / "training_history.json").read_text())
    assert history["steps"] == 2 and list(history["task_weights"]) == ["draft"]
    model = ChatTransformersVLM(
        model=str(tmp_path / "t" / "small"), top_logprobs=8, max_new_tokens=2
    )
    assert model.resize_spec.max_pixels == 128 * 128 and list(
        model.processor.image_processor.image_mean
    ) == [0.9, 0.9, 0.9]


def test_help_reads_as_help(capsys):
    """Every command's --help is plain text for a terminal: what the tool is, examples, no
    reStructuredText left over from docstrings."""
    top = run("--help")
    assert top.returncode == 0 and "SpecEyes (arXiv 2603.23483)" in top.stdout
    assert "examples:" in top.stdout and "speceyes demo" in top.stdout
    commands = top.stdout.split("{", 1)[1].split("}", 1)[0].split(",")
    assert {"demo", "bench", "report", "calibrate"} <= set(commands)
    helps = [run_here(capsys, c, "--help") for c in commands]
    assert all(code == 0 for code, _ in helps)
    for text in [top.stdout] + [text for _, text in helps]:
        assert text and "``" not in text and ":func:" not in text and ":class:" not in text


def test_serve_config_writes_configs_that_name_the_installed_graphs(tmp_path, capsys):
    """langgraph.json by module path (any install), aegra.json by this install's serve.py;
    the same graph ids and variables as the repository's langgraph.json; an existing file is
    kept unless --force."""
    import json
    from pathlib import Path

    from speceyes_graph import serve
    from speceyes_graph.cli import main

    assert main(["serve-config", str(tmp_path / "cfg")]) == 0
    shipped = json.loads((tmp_path / "cfg" / "langgraph.json").read_text())
    aegra = json.loads((tmp_path / "cfg" / "aegra.json").read_text())
    repo = json.loads((Path(__file__).parents[1] / "langgraph.json").read_text())
    variables = {g: spec["path"].rsplit(":", 1)[1] for g, spec in repo["graphs"].items()}
    assert {g: spec["path"] for g, spec in shipped["graphs"].items()} == {
        g: f"speceyes_graph.serve:{v}" for g, v in variables.items()
    }
    assert aegra["graphs"] == {
        g: f"{Path(serve.__file__).resolve()}:{v}" for g, v in variables.items()
    }
    # the chat's image route beside the graphs, by module and by this install's file
    from speceyes_graph.deploy import routes

    assert shipped["http"] == {"app": "speceyes_graph.deploy.routes:app"}
    assert aegra["http"] == {"app": f"{Path(routes.__file__).resolve()}:app"}
    # the shipped rules (the gate's namespace, owners, assistants) on Aegra too
    from speceyes_graph.deploy import auth

    assert shipped["auth"] == {"path": "speceyes_graph.deploy.auth:auth"}
    assert aegra["auth"] == {"path": f"{Path(auth.__file__).resolve()}:auth"}
    for spec in shipped["graphs"].values():
        module, variable = spec["path"].split(":")
        assert getattr(__import__(module, fromlist=[variable]), variable) is not None
    capsys.readouterr()
    assert main(["serve-config", str(tmp_path / "cfg")]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["serve-config", str(tmp_path / "cfg"), "--force"]) == 0


def test_a_missing_engine_says_how_to_install_it(monkeypatch):
    """The message names the package to install, not a script only a clone has."""
    import pytest

    from speceyes_graph.models import servers

    monkeypatch.delenv("SPECEYES_VLLM_PYTHON", raising=False)
    monkeypatch.setattr(servers, "_CHECKOUT", servers.Path("/nonexistent"))
    monkeypatch.chdir("/")
    with pytest.raises(servers.EngineNotInstalled, match=r"pip install vllm"):
        servers.find_engine_python("vllm")
