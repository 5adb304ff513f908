"""``prefixcache router``'s flags: a bad ``--replica`` is an argparse error naming the flag
at parse time (never a ZeroMQ traceback at start), and the help shows the whole form."""
from __future__ import annotations

import pytest

from prefixcache.cli import main
from prefixcache.router.specs import ReplicaSpec

BAD = [
    ("http://x,events=foo", "events='foo' is not tcp://HOST:PORT or ipc://PATH"),
    ("http://x,events=tcp://h:1,replay=foo", "replay='foo' is not tcp://HOST:PORT"),
    ("http://x,events=tcp://h", "events='tcp://h' is not tcp://HOST:PORT"),
    ("http://x,events=tcp://h:0", "events='tcp://h:0' is not tcp://HOST:PORT"),
    ("http://x,events=tcp://h:65536", "is not tcp://HOST:PORT"),
    ("http://x,events=tcp://*:5557", "is not tcp://HOST:PORT"),
    ("http://x,events=ipc://", "events='ipc://' is not tcp://HOST:PORT or ipc://PATH"),
    ("http://x,events=tcp://h:1,events=tcp://h:2", "events= given twice"),
    ("http://x,replay=tcp://h:1", "replay= without events="),
    ("http://x,evnts=tcp://h:1", "unknown option 'evnts=tcp://h:1'"),
    ("127.0.0.1:8000", "does not start with http:// or https://"),
    ("ftp://x", "does not start with http:// or https://"),
    ("http://", "has no valid host"),
    ("http://a b", "has no valid host"),
    ("http://x:99999", "is not valid"),
    ("http://x:abc", "is not valid"),
    ("http://x:0", "has port 0"),
    ("http://x/?q=1", "has a query or fragment"),
]


@pytest.mark.parametrize("spec,why", BAD)
def test_a_bad_replica_spec_is_an_argparse_error_naming_the_flag(spec, why, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["router", "--replica", "http://127.0.0.1:8001", "--replica", spec])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"prefixcache router: error: argument --replica: {spec!r}: " in err
    assert why in err
    assert "Traceback" not in err
    with pytest.raises(ValueError, match=r"^--replica: "):
        ReplicaSpec.parse(spec)


@pytest.mark.parametrize("spec,expected", [
    ("http://h:1/,events=tcp://h:2,replay=tcp://h:3", ("http://h:1", "tcp://h:2", "tcp://h:3")),
    ("https://r.example/v,events=ipc:///tmp/ev", ("https://r.example/v", "ipc:///tmp/ev", None)),
    ("http://[::1]:8001,events=tcp://[::1]:5557", ("http://[::1]:8001", "tcp://[::1]:5557",
                                                   None)),
    ("http://127.0.0.1:8001", ("http://127.0.0.1:8001", None, None)),
])
def test_good_replica_specs_parse(spec, expected):
    s = ReplicaSpec.parse(spec)
    assert (s.url, s.events, s.replay) == expected


def test_the_help_shows_the_replay_endpoint_too(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["router", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--replica URL[,events=EP[,replay=EP]]" in out
