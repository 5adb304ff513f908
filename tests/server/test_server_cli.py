"""``prefixcache serve``'s command line: the default model and served name, the
full ``--model`` string accepted as an alias, and a busy port found before the model
loads."""
from __future__ import annotations

import socket

import pytest
from starlette.testclient import TestClient

import prefixcache.engine.engine as engine_module
from prefixcache.cli import build_parser, main
from prefixcache.http.errors import APIError
from prefixcache.model.registry import DEFAULT_MODEL
from prefixcache.server.cli import build_app, check_port, served_name


def _args(*argv: str):
    return build_parser(["serve"]).parse_args(["serve", *argv])


def test_served_name_is_something_a_client_can_type(tmp_path):
    assert served_name(DEFAULT_MODEL) == DEFAULT_MODEL
    assert served_name("builtin:tiny") == "builtin:tiny"
    model_dir = tmp_path / "SmolLM2-135M-Instruct"
    model_dir.mkdir()
    assert served_name(str(model_dir)) == "SmolLM2-135M-Instruct"
    assert served_name(f"{model_dir}/") == "SmolLM2-135M-Instruct"
    gguf = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    assert served_name(str(gguf)) == "SmolLM2-135M-Instruct.Q4_1"
    # not a path here (a hub id, say): served under what the user typed
    assert served_name("org/missing-model") == "org/missing-model"


def test_serve_defaults_to_the_demos_model():
    args = _args()
    assert args.model == DEFAULT_MODEL == "smollm2-135m-instruct-q4_1"
    assert build_parser(["generate"]).parse_args(["generate", "x"]).model == DEFAULT_MODEL


def _accepts(app, model: str) -> bool:
    try:
        app.state.server.serving.prepare._check_model(model)
    except APIError as exc:
        assert exc.status == 404
        return False
    return True


def test_the_served_name_is_listed_and_the_model_string_accepted_too():
    app = build_app(_args("--model", "builtin:tiny", "--port", "0"))
    assert app.state.settings.model_names == ["builtin:tiny"]
    app = build_app(_args("--model", "builtin:tiny", "--port", "0",
                          "--served-model-name", "tiny", "small"))
    assert [_accepts(app, m) for m in ("tiny", "small", "builtin:tiny", "gpt-4o")] == [
        True, True, True, False]
    listed = TestClient(app, base_url="http://localhost").get("/v1/models").json()["data"]
    assert [(m["id"], m["root"]) for m in listed] == [("tiny", "builtin:tiny"),
                                                        ("small", "builtin:tiny")]


@pytest.fixture
def busy_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


def test_a_busy_port_fails_before_the_model_loads(busy_port, monkeypatch, capsys):
    loads = []
    monkeypatch.setattr(engine_module, "LLMEngine", lambda *a, **k: loads.append(a))
    assert main(["serve", "--model", "builtin:tiny", "--port", str(busy_port)]) == 2
    assert loads == []
    err = capsys.readouterr().err.strip()
    assert err == (f"prefixcache serve: error: cannot listen on 127.0.0.1:{busy_port}: "
                   "Address already in use")


def test_check_port_releases_a_free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    check_port("127.0.0.1", port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))  # still free: the check held it only briefly
    with pytest.raises(OSError, match=r"^cannot listen on no-such-host\.invalid:80: "):
        check_port("no-such-host.invalid", 80)


def test_a_busy_ipv6_port_is_named_in_brackets():
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with sock:
        sock.listen(1)
        port = sock.getsockname()[1]
        with pytest.raises(OSError, match=rf"^cannot listen on \[::1\]:{port}: "
                                          "Address already in use$"):
            check_port("::1", port)
